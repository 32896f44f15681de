# The two set-up commands: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.run-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[model]'
	touch $@

$(VENV)/.test-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[test]'
	touch $@

# The GPU machine's Triton (3.6, ../shared/GPU.md), beside the venv's own, for the compile check:
# older Tritons reject programs newer ones compile (tests/test_kernels_compile.py).
DEVICE_TRITON := $(VENV)/triton-3.6
$(DEVICE_TRITON)/triton: | $(BIN)/python
	$(BIN)/pip install -q --no-deps --target $(DEVICE_TRITON) 'triton==3.6.0'

run: $(VENV)/.run-stamp
	$(BIN)/strata serve

lint: $(VENV)/.test-stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Whole test files go to TEST_WORKERS processes (pytest-xdist), so a module's fixtures load once.
TEST_WORKERS ?= 2

test: lint $(DEVICE_TRITON)/triton
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV)
