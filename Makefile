.PHONY: install test test-load test-timing lint bench demo
install:
	python3 -m pip install -e '.[test]'
test:
	python3 -m pytest -q
test-timing:
	python3 -m pytest -q -m timing
test-load:
	CHIPTRACE_LOAD_TESTS=1 python3 -m pytest -q -m load
lint:
	ruff check . && ruff format --check .
bench:
	for b in benchmarks/bench_*.py; do python3 $$b || exit 1; done
demo:
	chiptrace demo
