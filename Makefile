# Two commands on a fresh machine: `make demo` (install + the main job) and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,he,dp,dp-torch,rl,flower

.PHONY: install demo test lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"

demo: install
	$(BIN)/securefed demo

test: install
	$(BIN)/python -P -m pytest -q

docs: install
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	$(BIN)/python -P docs/build_api.py build/api

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
