# dflash-dash: `make run` starts the dashboard on the demo workspace, `make test` runs the lint then every test, `make
# lint` checks the code without changing a file: ruff (lint rules and formatting), mypy (strict on the typed modules:
# [tool.mypy] in pyproject.toml) and no import circle inside a package (tests/test_arrows.py).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORKSPACE ?= cache
PORT ?= 8501
# torch's CPU wheels (a CUDA build: TORCH_INDEX=https://download.pytorch.org/whl/cu130, then requirements-gpu.txt)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: setup setup-test run test lint demo clean
LINTED := dflash_dash pages app.py tools tests benchmarks

# runtime needs only (requirements.txt): what `make run` installs
$(BIN)/.installed: requirements.txt constraints.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --retries 1 --no-deps torch==2.13.0 --extra-index-url $(TORCH_INDEX)
	$(BIN)/pip install -q torch==2.13.0 -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# test and lint needs on top (requirements-test.txt): what `make test` and `make lint` add
$(BIN)/.installed-test: $(BIN)/.installed requirements-test.txt requirements-gpu.txt constraints.txt
	$(BIN)/pip install -q -r requirements-test.txt -c constraints.txt
	touch $@

setup: $(BIN)/.installed

setup-test: $(BIN)/.installed-test

demo: setup
	$(BIN)/python -m dflash_dash --workspace $(WORKSPACE) demo

# the dashboard on 127.0.0.1:$(PORT) and the demo server on the port of $(WORKSPACE)/config.toml; Ctrl-C or
# SIGTERM stops both (dflash_dash/launch.py)
run: demo
	$(BIN)/python -m dflash_dash.launch --workspace $(WORKSPACE) --port $(PORT)

test: lint
	@command -v chromium >/dev/null 2>&1 || printf '\n*** Debian chromium is missing: the browser tests will be SKIPPED.\n*** Install it with: apt-get install -y chromium\n\n'
	$(BIN)/python -m pytest -q --durations=25 tests

lint: setup-test
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_arrows.py -k circle

clean:
	rm -rf $(VENV)
