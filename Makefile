.PHONY: install test lint bench demo
install:
	python3 -m pip install -e '.[test]'
test:
	python3 -m pytest -q
lint:
	ruff check . && ruff format --check .
bench:
	for b in benchmarks/bench_*.py; do python3 $$b || exit 1; done
demo:
	chiptrace demo
