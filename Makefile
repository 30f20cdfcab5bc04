# Two entry points (see README): `make run` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch, explicitly. Off this machine add
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0+cpu
TORCH_INDEX ?=
HOST ?= 127.0.0.1
PORT ?= 8050

.PHONY: install install-test compiler browser run test lint-docker bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python compiler
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
	$(BIN)/pip install -q -e ".[test]"

# A C compiler and Python's headers for core/_ntkernel.c (the tests check it is built; `make
# run` works without it, on the slower torch path).
compiler:
	@command -v cc >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q gcc libc6-dev; }
	@$(PYTHON) -c "import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
		|| { apt-get update -q && apt-get install -y -q python3-dev; }

# Debian's chromium for the browser tests and figure export (never `playwright install`).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

run: install
	$(BIN)/headgraph serve --host $(HOST) --port $(PORT)

test: install-test browser
	$(BIN)/python -m pytest -q

bench: install-test
	$(BIN)/python benchmarks/bench_core.py

clean:
	rm -rf $(VENV) build *.egg-info core/_ntkernel*.so
