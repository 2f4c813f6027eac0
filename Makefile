# rvqspec: build the environment, run the tests, execute the paper notebooks, benchmark.
#
#   make env                      create .venv (torch first, then requirements.txt, qwen-tts --no-deps, the project)
#   make test                     pytest on tests/
#   make paper                    execute every notebooks/NN_*.py -> build/executed/full/, refresh figures/
#   make paper SMOKE=1            small parameters (tiny model, few repeats) -> build/smoke_figures/
#   make paper MODEL=qwen3-tts-1.7b-random   another model -> figures/<model>/
#   make paper MODEL=<checkpoint> DATASET=<saved dataset> CODEC=<12 Hz tokenizer>   drafters on a real checkpoint
#        FLEURS=<saved Fleurs> LIBRISPEECH=<saved LibriSpeech> ASR=whisper:<dir>     WER parity (notebook 04) on it
#   make paper THREADS=2          torch threads in the timing notebooks (default 1, as the committed figures:
#                                 on a shared 2-core machine two threads spin-wait and time 3-8x slower)
#   make embedded                 rebuild the shipped small model data/embedded/ from scratch (apt voices, corpus,
#                                 codec, training, code decoder, evaluation, model card): about 3.8 h on 2 CPU cores, resumable
#   make bench [BENCH_MODEL=...]  latency table of the talker step and the code-predictor call (JSON in build/)
#   make clean                    remove build/ (figures/ holds committed results and is kept)
#
# Rules have real prerequisites: editing a notebook, the library or requirements.txt rebuilds what depends on it.

SHELL := /bin/bash
.DELETE_ON_ERROR:

VENV          := .venv
PY            := $(VENV)/bin/python
PIP           := $(PY) -m pip
STAMP         := $(VENV)/.installed
PYTHON3       ?= python3
# torch is pinned and installed FIRST: an unpinned torch (or one pulled by a dependency) is a multi-GB CUDA build.
# Elsewhere, pick the wheel flavour with e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
QWEN_TTS      := qwen-tts==0.1.1

LIB           := $(wildcard rvqspec_lib/*.py rvqspec_lib/*/*.py)
NB_SRC        := $(wildcard notebooks/[0-9][0-9]_*.py)
NB_BUILD      := $(patsubst notebooks/%.py,build/%.ipynb,$(NB_SRC))

# Notebook parameters passed by papermill (the first code cell of each notebook is tagged "parameters").
MODEL_TAG     := $(subst /,_,$(MODEL))
THREADS       ?= 1
RUN_TAG       := $(if $(SMOKE),smoke,full)$(if $(MODEL),-$(MODEL_TAG))$(if $(THREADS),-t$(THREADS))
EXEC_DIR      := build/executed/$(RUN_TAG)
FIG_DIR       ?= $(if $(SMOKE),build/smoke_figures$(if $(MODEL),/$(MODEL_TAG)),figures$(if $(MODEL),/$(MODEL_TAG)))
# one stamp per notebook IN the figures folder: deleting the folder (or its outputs' stamp) re-runs the notebook
NB_EXEC       := $(patsubst notebooks/%.py,$(FIG_DIR)/.%.done,$(NB_SRC))
# THREADS=N pins torch's thread count (e.g. THREADS=1 when other jobs keep a core busy; the tables say so).
# DATASET= / CODEC=: frames of real speech for a real checkpoint's drafters (notebook 02; VoxPopuli schema)
PM_PARAMS     := $(if $(SMOKE),-p smoke 1) $(if $(MODEL),-p model $(MODEL)) $(if $(THREADS),-p threads $(THREADS)) \
                 $(if $(DATASET),-p dataset $(DATASET)) $(if $(CODEC),-p codec $(CODEC)) \
                 $(if $(FLEURS),-p fleurs $(FLEURS)) $(if $(LIBRISPEECH),-p librispeech $(LIBRISPEECH)) \
                 $(if $(ASR),-p asr $(ASR)) \
                 -p out_dir $(abspath $(FIG_DIR))

BENCH_MODEL   ?= qwen3-tts-0.6b-random
BENCH_ARGS    ?=

EMBEDDED_WORK ?= build/embedded
EMBEDDED_ARGS ?=

.PHONY: all env test paper notebooks bench clean embedded

all: test paper

# ---- environment ------------------------------------------------------------------------------------------------
env: $(STAMP)

# qwen-tts goes in with --no-deps: it declares gradio (demo only) and torchaudio (no wheel loads against the pinned
# CPU torch; rvqspec_lib.models shims the import). Its other dependencies are in requirements.txt.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PIP) install $(TORCH_PIP_ARGS) torch==$(TORCH_VERSION)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps $(QWEN_TTS)
	$(PIP) install --no-deps -e .
	touch $@

# ---- tests ------------------------------------------------------------------------------------------------------
test: $(STAMP)
	$(PY) -m pytest -q tests

# ---- paper notebooks --------------------------------------------------------------------------------------------
notebooks: $(NB_BUILD)

paper: $(NB_EXEC)
	@echo "executed notebooks in $(EXEC_DIR)/, figures and tables in $(FIG_DIR)/"

build/%.ipynb: notebooks/%.py $(STAMP)
	@mkdir -p $(@D)
	$(VENV)/bin/jupytext --to ipynb -o $@ $<

$(FIG_DIR)/.%.done: build/%.ipynb $(LIB) $(STAMP)
	@mkdir -p $(EXEC_DIR) $(FIG_DIR)
	$(VENV)/bin/papermill $< $(EXEC_DIR)/$*.ipynb -k python3 --language python --cwd $(CURDIR) $(PM_PARAMS)
	@touch $@

# ---- the embedded model ------------------------------------------------------------------------------------------
# Built into build/embedded-out (every stage resumes when re-run), then swapped into data/embedded in one move, so
# an interrupted build never leaves a half-written shipped model. EMBEDDED_ARGS passes flags, e.g. "--minutes 100".
embedded: $(STAMP)
	bash scripts/apt-voices.sh
	nice -n 5 $(PY) scripts/build_embedded.py --scale full --threads 1 --out build/embedded-out \
	  --work $(EMBEDDED_WORK) $(EMBEDDED_ARGS)
	rm -rf data/embedded.new && cp -r build/embedded-out data/embedded.new
	rm -rf data/embedded.old && if [ -d data/embedded ]; then mv data/embedded data/embedded.old; fi
	mv data/embedded.new data/embedded && rm -rf data/embedded.old
	@echo "data/embedded rebuilt: see data/embedded/MODEL_CARD.md"

# ---- benchmark ----------------------------------------------------------------------------------------------------
bench: $(STAMP)
	@mkdir -p build
	$(VENV)/bin/rvqspec bench --model $(BENCH_MODEL) --json build/bench_$(subst /,_,$(BENCH_MODEL)).json $(BENCH_ARGS)

clean:
	rm -rf build .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print -exec rm -rf {} +
