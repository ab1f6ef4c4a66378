# `make run` and `make test` each build .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attnlab-installed
# The CPU wheel of torch lies on this machine's disk: pin it, or pip pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
export ATTNLAB_DATA_DIR ?= $(abspath ../shared/data)

.PHONY: run test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/attnlab train vit-digits

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/attention_core.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
