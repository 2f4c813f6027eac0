# rvqspec: build the environment, run the tests, execute the paper notebooks, benchmark.
#
#   make voices                   the Debian packages (scripts/apt-voices.sh: flite, festival voices, espeak-ng, sox;
#                                 as root or through sudo; a dpkg-query check and nothing else when installed;
#                                 without Debian: flite, espeak-ng and sox on PATH, from Homebrew on macOS)
#   make env                      create .venv (torch first, then requirements.txt, qwen-tts --no-deps, the project),
#                                 then time the embedded model's fastest path, what synth takes by default
#   make test [TEST_JOBS=2]       voices + env, then pytest on tests/ in TEST_JOBS processes (pytest-xdist)
#   make paper [PAPER_JOBS=2]     voices + env, then execute every notebooks/NN_*.py -> build/executed/full-t1/,
#                                 refresh figures/ (00, 02, 03, 05 side by side first, then the timing notebooks
#                                 01, 04, 06, 07 one at a time, alone on the machine); prints the run time of each notebook and of the make, and
#                                 writes them to figures/paper_run.{csv,md}; Ctrl-C leaves nothing half-written and
#                                 the next `make paper` runs only what was stopped (docs/reproducibility.md)
#   make paper SMOKE=1            small parameters (tiny model, few repeats) -> build/smoke_figures/
#                                 (one `make paper` at a time per checkout: a second refuses, naming build/.paper.lock)
#   make lab [LAB_PORT=8888]      JupyterLab from .venv on 127.0.0.1, the notebooks/*.py opening as notebooks
#   make paper MODEL=qwen3-tts-1.7b-random   another model -> figures/<model>/
#   make paper MODEL=<checkpoint> DATASET=<saved dataset> CODEC=<12 Hz tokenizer>   drafters on a real checkpoint
#        FLEURS=<saved Fleurs> LIBRISPEECH=<saved LibriSpeech> ASR=whisper:<dir>     WER parity (notebook 05) on it
#   make paper MODEL=<checkpoint> CPU_SIZES=0   the full sizes instead of the smaller cpu_sizes of the notebooks
#                                 that run on the CPU (hours on 2 cores; docs/reproducibility.md)
#   make paper THREADS=2          torch threads in the timing notebooks (default 1, as the committed figures:
#                                 on a shared 2-core machine two threads spin-wait and time 3-8x slower)
#   make embedded                 rebuild the shipped small model data/embedded/ from scratch (apt voices, corpus,
#                                 codec, training, code decoder, evaluation, model card): about 3.8 h on 2 CPU cores, resumable
#   make bench [BENCH_MODEL=...]  latency table of the talker step and the code-predictor call (rvqspec bench latency),
#                                 the call of every native precision through the official and the native forward
#                                 against its floor (rvqspec bench precisions), then the table to act on (rvqspec bench
#                                 table [BENCH_TABLE_ARGS]: stepped AR, fused AR, best speculative, fused speculative,
#                                 auto per native precision and backend; build/bench_table.*), then the whole frame
#                                 streamed (rvqspec bench pipeline [BENCH_PIPELINE_ARGS]: talker, inner loop and codec
#                                 decoder against their floors, first audio, RTF, underruns, concurrent streams;
#                                 build/pipeline*)
#   make bench-gpu                on a CUDA machine: notebook 07's GPU leg (rvqspec bench frames --device cuda; build/gpu_bench.json)
#   make help                     this list
#   make check-figures            are the committed figures/ one clean `make paper` run of the sources at HEAD?
#                                 (one line per stale group of results and the files changed since; exit 1 if not)
#   make stats                    the library's size and the redesign's counts (scripts/stats.py: lines, function-local
#                                 imports, constructions outside the registry, resolvers, labels, timed loops)
#   make clean                    remove build/ (figures/ holds committed results and is kept)
#
# Rules have real prerequisites: editing a notebook, the library or requirements.txt rebuilds what depends on it.

SHELL := /bin/bash
.DELETE_ON_ERROR:

VENV          := .venv
PY            := $(VENV)/bin/python
PIP           := $(PY) -m pip
STAMP         := $(VENV)/.installed
# the JupyterLab setting that opens notebooks/*.py as notebooks, installed into .venv (see `lab` below)
LAB_SETTINGS  := $(VENV)/share/jupyter/lab/settings/overrides.d/rvqspec.json
LAB_PORT      ?= 8888
PYTHON3       ?= python3
# torch is pinned and installed FIRST: an unpinned torch (or one pulled by a dependency) is a multi-GB CUDA build.
# Elsewhere, pick the wheel flavour with e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
QWEN_TTS      := qwen-tts==0.1.1

LIB           := $(wildcard rvqspec_lib/*.py rvqspec_lib/*/*.py rvqspec_lib/*/*/*.py rvqspec_lib/*/*/*.c bench/*.py paper/*.py \
                 recipes/*/*.py tools/*.py)
# the paper's notebooks, in run order (overridable: the tests run the rules below on tiny fake notebooks)
NB_SRC        ?= $(wildcard notebooks/[0-9][0-9]_*.py)
NB_BUILD      := $(patsubst notebooks/%.py,build/%.ipynb,$(NB_SRC))

# Notebook parameters passed by papermill (the first code cell of each notebook is tagged "parameters").
# SMOKE=1 (not 0/false/no): small parameters; MODEL=: another model; THREADS=N pins torch's thread count (default 1,
# as the committed figures; the tables say so); DATASET= / CODEC=: frames of real speech for a real checkpoint's
# drafters (notebook 03; VoxPopuli schema); FLEURS= / LIBRISPEECH= / ASR=: notebook 05's data sets and recogniser.
# DEVICE=auto|cpu|cuda|mps: where notebooks 01, 03 and 05 load their models (04, 06 and 07 time the CPU-only native
# paths: they stay on the CPU); default: each notebook's own (auto).
# CPU_SIZES=0: a full run on a real-size checkpoint whose models run on the CPU keeps the notebooks' full sizes (made
# for the small embedded model: hours on 2 cores) instead of their `cpu_sizes` (paper.checkpoint.cpu_sized).
SMOKE_ON      := $(filter-out 0 false no,$(SMOKE))
# the figures folder's name for MODEL: a folder's base name (a trailing / dropped), a hub id's name after the owner
# (Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice -> Qwen3-TTS-12Hz-0.6B-CustomVoice), a model name as it is
MODEL_TAG     := $(notdir $(patsubst %/,%,$(MODEL)))
THREADS       ?= 1
RUN_TAG       := $(if $(SMOKE_ON),smoke,full)$(if $(MODEL),-$(MODEL_TAG))$(if $(THREADS),-t$(THREADS))
# papermill writes a notebook as it runs into PARTIAL_DIR; the executed notebook, outputs included (figures, tables,
# audio players), is moved when it ends into EXEC_DIR: beside the figures for a full run (committed, so a fresh clone
# or a browser shows the executed notebooks), under build/ for a smoke run
PARTIAL_DIR   := build/executed/$(RUN_TAG)
FIG_DIR       ?= $(if $(SMOKE_ON),build/smoke_figures$(if $(MODEL),/$(MODEL_TAG)),figures$(if $(MODEL),/$(MODEL_TAG)))
EXEC_DIR      := $(if $(SMOKE_ON),$(PARTIAL_DIR),$(FIG_DIR)/notebooks)
PM_PARAMS     := $(strip $(if $(SMOKE_ON),-p smoke 1) $(if $(MODEL),-p model $(MODEL)) \
                 $(if $(THREADS),-p threads $(THREADS)) $(if $(DATASET),-p dataset $(DATASET)) \
                 $(if $(CODEC),-p codec $(CODEC)) $(if $(FLEURS),-p fleurs $(FLEURS)) \
                 $(if $(LIBRISPEECH),-p librispeech $(LIBRISPEECH)) $(if $(ASR),-p asr $(ASR)) \
                 $(if $(DEVICE),-p device $(DEVICE)) $(if $(filter 0 false no,$(CPU_SIZES)),-p cpu_sizes None) \
                 -p out_dir $(abspath $(FIG_DIR)))
# One stamp per notebook IN the figures folder (deleting the folder, or a stamp, re-runs the notebook), and the
# parameters the folder's outputs were made with beside them (.paper-params): a run with other parameters (another
# THREADS, DATASET, ...) rewrites that file, so every notebook of the folder runs again; never a stamp of another run.
NB_EXEC       := $(patsubst notebooks/%.py,$(FIG_DIR)/.%.done,$(NB_SRC))
PARAMS_FILE   := $(FIG_DIR)/.paper-params
# this invocation of make, written into the stamps it makes, so that `make paper` can say which notebooks it ran
RUN_ID        := $(shell date +%s%N)
ifneq ($(SMOKE_ON),)
ifneq ($(filter figures figures/%,$(patsubst $(CURDIR)/%,%,$(abspath $(FIG_DIR)))),)
$(error SMOKE=1 writes under build/, never into the committed figures/: drop FIG_DIR=$(FIG_DIR) or point it under build/)
endif
endif

BENCH_MODEL   ?= qwen3-tts-0.6b-random
TEST_JOBS     ?= 2
BENCH_ARGS    ?=

EMBEDDED_WORK ?= build/embedded
EMBEDDED_ARGS ?=

.PHONY: help all voices env test paper paper-run notebooks lab bench bench-gpu clean embedded check-figures stats FORCE

all: test paper

help:
	@sed -n '1,/^# Rules have/p' $(firstword $(MAKEFILE_LIST)) | sed -e '$$d' -e 's/^# \{0,1\}//'

# ---- environment ------------------------------------------------------------------------------------------------
# The Debian packages are checked on every `make test` / `make paper` (phony: a stamp would go stale when a package
# is removed); installed ones cost one dpkg-query each, no apt-get update. Without root or sudo the script prints
# the one command to run as root and make stops.
voices:
	@bash scripts/apt-voices.sh

env: voices $(STAMP) $(LAB_SETTINGS)

# qwen-tts goes in with --no-deps: it declares gradio (demo only) and torchaudio (no wheel loads against the pinned
# CPU torch; rvqspec_lib.models shims the import). Its other dependencies are in requirements.txt.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON3) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "make: $(PYTHON3) is missing or older than Python 3.10: name a newer one, e.g. make PYTHON3=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PIP) install $(TORCH_PIP_ARGS) torch==$(TORCH_VERSION)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps $(QWEN_TTS)
	$(PIP) install --no-deps -e .
	@# the fastest path synth takes by default, timed once for the shipped model on this machine (~30 s; cached in
	@# $$RVQSPEC_CACHE or ~/.cache/rvqspec; a run crowded by other processes is not kept, and synth then says so)
	$(PY) -m rvqspec_lib.cli.main prepare --model embedded --stages auto || echo "note: the timing of the default path failed: rvqspec prepare --model embedded --stages auto retries it"
	touch $@

# ---- tests ------------------------------------------------------------------------------------------------------
test: voices $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile tests

# ---- paper notebooks --------------------------------------------------------------------------------------------
notebooks: $(NB_BUILD)

# One `make paper` at a time in a checkout: two at once would run every notebook twice into the same folders and
# report each other's stamps. After the Debian packages and the environment are checked, the run holds a flock(1) on
# build/.paper.lock (released when make exits: finished, failed or interrupted) and runs `paper-run` in a sub-make
# (-o: the packages and .venv are not checked twice); a second run refuses with one line naming the lock. Where
# flock(1) is missing (util-linux; macOS has none) no lock is taken.
PAPER_LOCK    := build/.paper.lock
# notebooks run side by side by `make paper` (the timing notebooks never: see TIMING_NB below); 1: one at a time
PAPER_JOBS    ?= 2

paper: voices $(STAMP)
	@mkdir -p $(dir $(PAPER_LOCK)) && exec 9>$(PAPER_LOCK); \
	if command -v flock >/dev/null && ! flock -n 9; then \
	  echo "paper: another make paper is running in this checkout (it holds $(PAPER_LOCK)): wait for it to end, or stop it" >&2; \
	  exit 1; fi; \
	$(PY) -m tools.paper_run --project --fig-dir $(FIG_DIR) --run-tag $(RUN_TAG) --model-tag '$(MODEL_TAG)' \
	  --timing '$(TIMING_NB)' --jobs $(PAPER_JOBS) --model '$(MODEL)' --cpu-sizes '$(CPU_SIZES)' || true; \
	$(MAKE) --no-print-directory -j$(PAPER_JOBS) -o voices -o $(STAMP) paper-run

# what `paper` runs under its lock (started alone it takes no lock). After every notebook succeeded it prints which
# ran and the run-time record (this make's wall time, each notebook's papermill duration) and writes that record
# beside the figures, $(FIG_DIR)/paper_run.{csv,md} + provenance (tools/paper_run.py); a make that ran
# no notebook keeps the previous record.
paper-run: $(NB_EXEC)
	@ran=""; kept=""; \
	for s in $(NB_EXEC); do n=$$(basename "$$s" .done); n=$${n#.}; read -r id when path < "$$s" || true; \
	  if [ "$$id" = "$(RUN_ID)" ]; then ran="$$ran $$n"; else kept="$$kept $$n (executed $$when: $$path)"; fi; \
	done; \
	echo "paper $(RUN_TAG): executed now:$${ran:- none}$${ran:+ -> $(EXEC_DIR)/}"; \
	if [ -n "$$kept" ]; then echo "  up to date, not run again (same notebook, library and parameters):$$kept"; fi; \
	echo "  figures and tables in $(FIG_DIR)/; parameters: $(PM_PARAMS)"
	@$(PY) -m tools.paper_run --fig-dir $(FIG_DIR) --run-tag $(RUN_TAG) --start-ns $(RUN_ID) \
	  --params '$(PM_PARAMS)' $(NB_EXEC)

# Ctrl-C (SIGINT) at any point leaves no half-written file under a final name, so the next `make paper` re-runs
# exactly the notebooks whose stamps are missing or older than their prerequisites: the converted notebook, the
# executed notebook, the stamp and .paper-params are each written to a temporary name in the same folder and moved
# into place (mv is rename(2): whole or absent); papermill writes the executed notebook as it goes, so it runs into
# $(PARTIAL_DIR)/NN_name.partial.ipynb (kept after a failure or an interrupt, for reading) and is renamed when it ends;
# figures and tables are written all-or-nothing by save_figure / save_table; the stamp is the last thing written.
build/%.ipynb: notebooks/%.py $(STAMP)
	@mkdir -p $(@D)
	$(VENV)/bin/jupytext --to ipynb -o $@.part.ipynb $< && mv -f $@.part.ipynb $@

# rewritten only when the parameters differ from those of the folder's last run (FORCE runs the check every time)
$(PARAMS_FILE): FORCE
	@mkdir -p $(@D)
	@echo '$(PM_PARAMS)' | cmp -s - $@ || { echo '$(PM_PARAMS)' > $@.part && mv -f $@.part $@; \
	  echo "paper: $(FIG_DIR)/ gets new parameters: $(PM_PARAMS)"; }

# The notebooks whose numbers must not follow the CPU's instruction set (00: the recogniser on fixed audio; 05: it, and
# the decoders it samples) run with their kernels pinned before Python starts, on x86-64: oneMKL's compatible branch,
# torch's own kernels and oneDNN at AVX2, OpenBLAS's Haswell kernel (docs/reproducibility.md#on-another-cpu). The
# timing notebooks keep the CPU's own kernels: they measure this machine. So does a released checkpoint (MODEL other
# than the models built here, PIN_MODELS): it loads in bfloat16 where the CPU runs that natively, so its numbers follow
# the CPU anyway, and pinned kernels would emulate its bfloat16 (docs/model.md#device-and-dtype).
PINNED_NB     ?= 00 05
PIN_MODELS    := embedded tiny-random qwen3-tts-0.6b-random qwen3-tts-1.7b-random
PIN_ENV       := $(if $(and $(filter x86_64 amd64,$(shell uname -m)),$(or $(if $(MODEL),,none),$(filter $(PIN_MODELS),$(MODEL)))),\
                 MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell)

# RVQSPEC_PROGRESS=console: progress bars go to this console, not into the executed notebook (common/progress.py)
$(FIG_DIR)/.%.done: build/%.ipynb $(LIB) $(STAMP) $(PARAMS_FILE) | voices
	@mkdir -p $(PARTIAL_DIR) $(EXEC_DIR) $(FIG_DIR)
	$(if $(filter $(PINNED_NB),$(firstword $(subst _, ,$*))),$(PIN_ENV)) RVQSPEC_PROGRESS=console $(VENV)/bin/papermill $< $(PARTIAL_DIR)/$*.partial.ipynb -k python3 --language python --cwd $(CURDIR) $(PM_PARAMS)
	@mv -f $(PARTIAL_DIR)/$*.partial.ipynb $(EXEC_DIR)/$*.ipynb
	@echo "$(RUN_ID) $$(date -u +%Y-%m-%dT%H:%M:%SZ) $(EXEC_DIR)/$*.ipynb" > $@.part && mv -f $@.part $@

# A timing notebook runs ALONE, also under `make -j` (`paper` runs with -j$(PAPER_JOBS)): a timing cell sharing the
# cores measures the other process's load (the committed figures of the tree and export notebooks once did;
# eval/timing.py flags a timing during which other processes used more than 20% of the CPU). So each timing
# notebook's stamp gets, as ORDER-ONLY prerequisites, the previous timing notebook's stamp (01 before 04 before 06
# before 07) and every other notebook's stamp: the other notebooks (00, 02, 03, 05: no timing) run first, side by
# side, then the timing notebooks one after another.
# Order-only: a prerequisite that is up to date is not re-run and its time stamp does not count, so a stale 04 alone
# runs at once. (Run alone, `make figures/.04_x.done` first makes the missing stamps it is ordered after.)
# TIMING_NB lists the notebooks' numbers. (GNU make manual, "Types of Prerequisites": order-only ones.)
TIMING_NB     ?= 01 04 06 07
TIMING_EXEC   := $(foreach n,$(TIMING_NB),$(filter $(FIG_DIR)/.$(n)_%.done,$(NB_EXEC)))
OTHER_EXEC    := $(filter-out $(TIMING_EXEC),$(NB_EXEC))
$(if $(and $(TIMING_EXEC),$(OTHER_EXEC)),$(eval $(TIMING_EXEC): | $(OTHER_EXEC)))
# pairs "later:|earlier" from the list and the list shifted by one; the unpaired ":|last" is dropped
$(foreach p,$(filter-out :|%,$(join $(wordlist 2,$(words $(TIMING_EXEC)),$(TIMING_EXEC)),$(addprefix :|,$(TIMING_EXEC)))),\
  $(eval $(subst :|,: | ,$(p))))

FORCE:

# ---- the committed figures ---------------------------------------------------------------------------------------
# every provenance record under figures/ names one revision R, none is dirty, and the tracked sources are unchanged
# between R and HEAD; otherwise one line per stale group and the files changed since, exit 1 (docs/reproducibility.md).
# Standard library and git only: .venv's python when there is one, else python3.
CHECK_FIGURES_DIR ?= figures
check-figures:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON3)) scripts/check_figures.py --figures $(CHECK_FIGURES_DIR)

# ---- JupyterLab ---------------------------------------------------------------------------------------------------
# jupyter/overrides.json sets the document manager's default viewer of Python files to jupytext's notebook, so the
# paired notebooks/*.py open as notebooks on a double click (Open With -> Editor still shows the text). It is copied
# into the overrides.d folder of the venv's JupyterLab application settings, which every `jupyter lab` started from
# .venv reads (jupyterlab_server: <sys.prefix>/share/jupyter/lab/settings/overrides.d/*.json).
$(LAB_SETTINGS): jupyter/overrides.json $(STAMP)
	mkdir -p $(@D)
	install -m 644 $< $@

lab: $(LAB_SETTINGS)
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --port=$(LAB_PORT) --ServerApp.root_dir=$(CURDIR) \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

# ---- the embedded model ------------------------------------------------------------------------------------------
# Built into build/embedded-out (every stage resumes when re-run), then swapped into data/embedded in one move, so
# an interrupted build never leaves a half-written shipped model. EMBEDDED_ARGS passes flags, e.g. "--minutes 100".
embedded: voices $(STAMP)
	nice -n 5 $(PY) -m recipes.embedded.build --scale full --threads 1 --out build/embedded-out \
	  --work $(EMBEDDED_WORK) $(EMBEDDED_ARGS)
	rm -rf data/embedded.new && cp -r build/embedded-out data/embedded.new
	rm -rf data/embedded.old && if [ -d data/embedded ]; then mv data/embedded data/embedded.old; fi
	mv data/embedded.new data/embedded && rm -rf data/embedded.old
	@echo "data/embedded rebuilt: see data/embedded/MODEL_CARD.md"

# ---- benchmark ----------------------------------------------------------------------------------------------------
bench: $(STAMP)
	@mkdir -p build
	$(VENV)/bin/rvqspec bench latency --model $(BENCH_MODEL) --json build/bench_$(subst /,_,$(BENCH_MODEL)).json $(BENCH_ARGS)
	$(VENV)/bin/rvqspec bench precisions --model $(BENCH_MODEL) --repeats 15 --no-progress --json build/bench_floor_$(subst /,_,$(BENCH_MODEL)).json
	$(VENV)/bin/rvqspec bench table --table-out build/bench_table $(BENCH_TABLE_ARGS)
	$(VENV)/bin/rvqspec bench pipeline --table-out build/pipeline --no-progress $(BENCH_PIPELINE_ARGS)

# the GPU leg notebook 07 shows (on a machine with CUDA): the 0.6B architecture's frames through backend compile,
# the verify cost curve and, with notebook 04's calibration, the calibrated trees and the projection
GPU_CALIBRATION := $(wildcard figures/04_trees_heads.json)
GPU_TREES := ,tree:calibrated:4,tree:calibrated:8,tree:calibrated:16,tree:calibrated:32,tree:calibrated:64
bench-gpu: $(STAMP)
	@mkdir -p build
	$(VENV)/bin/rvqspec bench frames --device cuda --model qwen3-tts-0.6b-random --dtype bfloat16 --backends compile \
	  --threads 1 --repeats 30 --warmup 3 --queries 1,2,4,8,16,32,64 --json build/gpu_bench.json \
	  --decoders ar,chain:2,chain:4,chain:8$(if $(GPU_CALIBRATION),$(GPU_TREES) --calibration $(GPU_CALIBRATION))

stats:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON3)) scripts/stats.py

clean:
	rm -rf build .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print -exec rm -rf {} +
