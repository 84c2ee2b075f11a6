# make demo   install, start the local stack, run the example responses, cancel one mid-batch, stop
# make test   install, run the test suite (real Redis, real prefork workers)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install demo test test-fast lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,redis-server]"
	touch $@

demo: install
	bash examples/demo.sh

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .toolfleet
