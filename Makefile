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

run: $(VENV)/.run-stamp
	$(BIN)/strata serve

lint: $(VENV)/.test-stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Whole test files go to TEST_WORKERS processes (pytest-xdist), so a module's fixtures load once.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV)
