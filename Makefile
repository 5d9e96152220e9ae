# Two commands: `make lab` (install if needed, then JupyterLab on notebooks/) and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
EXTRAS  ?= mpi
STAMP   := $(VENV)/.installed-$(EXTRAS)
HERE    := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
# JupyterLab's settings overrides inside the venv (sys.prefix/share/jupyter/lab/settings): no "get Jupyter news?"
# pop-up, no update check; the same file Binder's postBuild installs.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: lab test install pytest nbval browser-deps clean gpu-check

install: $(STAMP) $(LAB_OVERRIDES)

# Re-runs only when requirements.txt or pyproject.toml changed (a stamp file records the last install).
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -e ".[$(EXTRAS)]"
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

pytest: install browser-deps
	$(PY) -m pytest tests -q

# Each notebook appends its lesson tally (and its separate exercise tally) to runs/lessons.jsonl; the last lines
# total the run.
# The total prints whether nbval passed or failed; the target keeps nbval's exit status.
LESSON_LOG := $(CURDIR)/runs/lessons.jsonl
nbval: install
	@mkdir -p runs && rm -f $(LESSON_LOG)
	LABKIT_LESSON_LOG=$(LESSON_LOG) $(PY) -m pytest -q --nbval-lax --nbval-current-env --nbval-cell-timeout=900 \
	  -p no:cacheprovider notebooks; rc=$$?; $(PY) -m labkit.core.lessons $(LESSON_LOG); \
	  $(PY) -m labkit.core.exercises $(LESSON_LOG); exit $$rc

test: pytest nbval

# On a CUDA box: tests + every notebook in full mode + loop-overhead, memory and ladder benchmarks -> docs/gpu-report.md.
# Without a GPU: says so and dry-runs the report writer on recorded fixtures (exit 0).
gpu-check: install
	$(PY) scripts/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache runs
