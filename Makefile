# Two commands: `make lab` (install if needed, then JupyterLab on notebooks/) and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
EXTRAS  ?= mpi
# TensorFlow's build: CUDA ("gpu") where an NVIDIA driver is present (nvidia-smi on PATH), else the CPU build of
# requirements.txt (CPU boxes, Binder, CI unchanged). Override with `make install TF_BUILD=cpu` (or gpu).
TF_BUILD ?= $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,cpu)
TF_GPU_SPEC := tensorflow[and-cuda]==2.21.*
STAMP   := $(VENV)/.installed-$(EXTRAS)-tf$(TF_BUILD)
ifeq ($(TF_BUILD),gpu)
# requirements.txt without tensorflow-cpu, plus the CUDA build (the two would install the same `tensorflow` package)
PIP_REQS = $(PY) -m pip uninstall -q -y tensorflow-cpu 2>/dev/null; \
	grep -v '^tensorflow-cpu' requirements.txt | $(PY) -m pip install -q -r /dev/stdin "$(TF_GPU_SPEC)"
else
PIP_REQS = $(PY) -m pip install -q -r requirements.txt
endif
HERE    := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
# JupyterLab's settings overrides inside the venv (sys.prefix/share/jupyter/lab/settings): no "get Jupyter news?"
# pop-up, no update check; the same file Binder's postBuild installs.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: lab test test-busy install pytest nbval browser-deps clean gpu-check gpu-wheels book

install: $(STAMP) $(LAB_OVERRIDES)

# Re-runs only when requirements.txt or pyproject.toml changed (a stamp file records the last install).
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP_REQS) -e ".[$(EXTRAS)]"
	@touch $(STAMP)

$(LAB_OVERRIDES): $(HERE)binder/overrides.json $(STAMP)
	@mkdir -p $(dir $@)
	cp $< $@

ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: install
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Two xdist workers by default (tests/conftest.py keeps one file on one worker and gives each its own TMPDIR);
# PYTEST_WORKERS=0 runs them in this one process.
PYTEST_WORKERS ?= 2
pytest: install browser-deps
	$(PY) -m pytest tests -q $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup)

# Each notebook appends its lesson tally (and its separate exercise tally) to runs/lessons.jsonl; the last lines
# total the run.
# The total prints whether nbval passed or failed; the target keeps nbval's exit status.
# Two notebooks at a time by default (NBVAL_WORKERS=0: one at a time, a quiet machine's tally): each is the other's
# busy neighbour, which every timing claim must survive (checked, or INCONCLUSIVE with its measured CPU share).
LESSON_LOG := $(CURDIR)/runs/lessons.jsonl
NBVAL_WORKERS ?= 2
nbval: install
	@mkdir -p runs && rm -f $(LESSON_LOG)
	LABKIT_LESSON_LOG=$(LESSON_LOG) $(PY) -m pytest -q --nbval-lax --nbval-current-env --nbval-cell-timeout=900 \
	  -p no:cacheprovider $(if $(filter-out 0,$(NBVAL_WORKERS)),-n $(NBVAL_WORKERS) --dist loadfile) notebooks; rc=$$?; $(PY) -m labkit.core.lessons $(LESSON_LOG); \
	  $(PY) -m labkit.core.exercises $(LESSON_LOG); exit $$rc

test: pytest nbval

# The lab as a static site: every notebook run as nbval runs it (fast on a CPU, full on a GPU), outputs kept, then
# Sphinx + MyST-NB with execution off -> build/book/html/index.html. A notebook that fails stops it (notebook, cell,
# error). BOOK_NOTEBOOKS="00_start_here.ipynb 06_all_reduce.ipynb" builds only those.
BOOK_OUT ?= build/book
book: install
	$(PY) scripts/book.py build --out $(BOOK_OUT) $(if $(BOOK_NOTEBOOKS),--notebooks $(BOOK_NOTEBOOKS))

# `make test` with one process spinning on one core for the whole run (started and always stopped by the script):
# every timing claim must be checked or INCONCLUSIVE with its measured reason, none failed.
test-busy: install browser-deps
	$(PY) scripts/run_busy.py --cores 1 -- $(MAKE) test

# On a CUDA box: the GPU tests + every notebook in full mode + loop-overhead, checkpoint-price and memory benchmarks
# -> docs/gpu-report.md, inside a lent GPU's 10-minute slot. Without a GPU: says so and dry-runs the report writer on
# recorded fixtures (exit 0). A lent box that reaches no registry: run `make gpu-wheels` where one is reachable, carry
# .whl/ along, and there `make gpu-check` uses the box's own python3 with those wheels (no venv to build).
GPU_WHEELS := $(wildcard .whl/*.whl)
gpu-check: $(if $(GPU_WHEELS),,install)
	$(if $(GPU_WHEELS),python3,$(PY)) scripts/gpu_check.py $(GPU_CHECK_ARGS)

gpu-wheels: install
	$(PY) scripts/gpu_wheels.py

clean:
	rm -rf $(VENV) .pytest_cache runs
