.PHONY: install test test-load test-timing lint bench demo
install:
	python3 -m pip install -e '.[test]'
test:
	python3 -m pytest -q
test-timing:
	python3 -m pytest -q -m timing
test-load:
	CHIPTRACE_LOAD_TESTS=1 python3 -m pytest -q -m load
# Style, types, then the layer contracts (docs/architecture.md). mypy and import-linter run on
# build/mapped, a link tree of the package as installed (exporters/ and viewer/ inside it).
lint:
	ruff check . && ruff format --check .
	python3 .ci/mapped.py mypy
	python3 .ci/mapped.py contracts
# Each benchmark writes benchmarks/results/<name>.json; the table in README.md is
# rendered from them. `make bench BENCH_ARGS=--quick` for the short runs.
BENCH_ARGS ?=
bench:
	status=0; for b in benchmarks/bench_*.py; do python3 $$b $(BENCH_ARGS) || status=1; done; \
	python3 benchmarks/_table.py README.md; exit $$status
demo:
	chiptrace demo
