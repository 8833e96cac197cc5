# Convenience targets; README.md gives the two commands that need nothing but Python.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: venv demo types test test-all bench ci clean

venv:
	$(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q -e '.[dev,postgres,otel]'

demo: venv
	$(BIN)/python -m cronoq demo

types: venv
	$(BIN)/mypy

test: venv
	$(BIN)/python -m pytest -n 2 -q

test-all: venv  # with the 3,000-seed simulation sweep
	$(BIN)/python -m pytest -n 2 -q --runslow

bench: venv
	$(BIN)/python bench/engine.py --quick
	$(BIN)/python bench/runtime.py --tasks 50000 --repeat 3
	$(BIN)/python bench/telemetry.py
	$(BIN)/python bench/compat.py --repeat 1
	$(BIN)/python bench/store.py --quick

ci:
	./.ci/run

clean:
	rm -rf $(VENV) .venv-ci build dist *.egg-info .pytest_cache .hypothesis
