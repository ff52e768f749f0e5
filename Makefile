# `make check` is what a change must pass: lint, format, types, tests.
.PHONY: check test lint bench

check: lint test

lint:
	ruff check .
	ruff format --check .
	mypy -p fmsdata

test:
	python -m pytest -q

bench:
	python benchmarks/throughput.py
