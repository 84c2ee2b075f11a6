# make demo   install, start the local stack, run the example responses, cancel one mid-batch, stop
# make test   install, run the test suite (real Redis, real prefork workers)
# make bench  install with the bench extra, run the benchmark suite, write bench/results/ (< 10 min)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install demo test test-fast lint bench clean

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

$(VENV)/.installed-bench: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install --quiet -e ".[test,redis-server,bench]"
	touch $@

bench: $(VENV)/.installed-bench
	BENCH_VIA_MAKE=1 $(BIN)/python -m bench $(BENCH_ARGS)

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .toolfleet
