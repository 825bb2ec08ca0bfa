# Workbench tasks (GNU make). `make` alone prints the list of targets.
#
# Variables you can override on the command line, e.g. `make test PYTEST_ARGS="-k norm"`:
#   PYTHON       interpreter used to create the venv (default python3)
#   VENV         where the venv lives (default .venv)
#   PYTEST_ARGS  extra arguments for pytest             (make test)
#   TEST_WORKERS pytest-xdist processes, auto: one per core; 0: in this process  (make test)
#   FULL         1 = make test also runs the tests marked slow (whole studies, notebooks under
#                papermill, subprocess sweeps); CI does (.ci/run); default 0: minutes on 2 cores
#   SWEEP_ARGS   extra arguments for `workbench sweep`   (make sweep)
#   REPORT_ARGS  extra arguments for `workbench report`  (make report)
#   LAB_ARGS     extra arguments for `jupyter lab`       (make lab)
#   GPU_ONLINE   1 = on a CUDA host, install the extras from the package registry
#                (default 0: offline, from the .whl/ bundle made by `make wheels`)

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=
FULL ?= 0
TEST_WORKERS ?= auto
SWEEP_ARGS ?=
REPORT_ARGS ?=
LAB_ARGS ?=
GPU_ONLINE ?= 0

# The CPU torch wheel that lies on local disk here; keep in step with environment.yml's comment.
CPU_TORCH := torch==2.13.0
EXTRAS := notebooks,gpu,dev
WHEELS_DIR := .whl
WHEEL_LIST := tools/gpu-wheels.txt
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.workbench-setup.stamp
MAKE_START := $(shell date +%s)

.PHONY: help setup test report sweep lab wheels clean distclean

help: ## list the targets (the default goal)
	@echo "Workbench: make TARGET [VAR=value ...]"
	@echo
	@awk 'BEGIN { FS = ":[^#]*## " } /^[a-z][a-z-]*:[^#]*## / { printf "  %-10s %s\n", $$1, $$2 }' $(firstword $(MAKEFILE_LIST)) \
	  | sed -e 's|\$$(VENV)|$(VENV)|g' -e 's|\$$(WHEELS_DIR)|$(WHEELS_DIR)|g'
	@echo
	@echo "Variables: PYTHON=$(PYTHON) VENV=$(VENV) FULL=$(FULL) PYTEST_ARGS SWEEP_ARGS REPORT_ARGS LAB_ARGS GPU_ONLINE=$(GPU_ONLINE)"

setup: $(STAMP) ## create $(VENV) and install the project with all extras (CPU torch here; a CUDA host keeps its own torch)
	@:

# Re-runs when pyproject.toml changes; quick no-op otherwise.
$(STAMP): pyproject.toml
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then cuda=1; else cuda=0; fi
	if [ ! -x "$(VPY)" ]; then
	  if [ "$$cuda" = 1 ]; then
	    echo "setup: CUDA host: creating $(VENV) on top of the preinstalled packages (torch is not installed)"
	    $(PYTHON) -m venv --system-site-packages "$(VENV)"
	    # When $(PYTHON) is itself a venv, --system-site-packages only exposes the *base*
	    # interpreter's site-packages: link the parent venv's site-packages explicitly.
	    parent_sites=$$($(PYTHON) -c 'import site, sys; print(" ".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
	    own_site=$$("$(VPY)" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	    for s in $$parent_sites; do echo "import site; site.addsitedir('$$s')"; done > "$$own_site/_workbench_parent_env.pth"
	  else
	    echo "setup: no CUDA device: creating $(VENV) with $(PYTHON)"
	    $(PYTHON) -m venv "$(VENV)"
	  fi
	fi
	if [ "$$cuda" = 1 ]; then
	  if [ "$(GPU_ONLINE)" = 1 ]; then
	    "$(VPY)" -m pip install -q -e '.[$(EXTRAS)]'
	  else
	    if compgen -G "$(WHEELS_DIR)/*.whl" >/dev/null; then
	      echo "setup: installing the offline bundle $(WHEELS_DIR)/"
	      "$(VPY)" -m pip install -q --no-index --no-deps "$(WHEELS_DIR)"/*.whl
	    else
	      echo "setup: warning: no $(WHEELS_DIR)/ bundle: papermill and the kernel may be missing (see make wheels)"
	    fi
	    # No registry and no build: put the source tree on the venv's path (python -m workbench).
	    own_site=$$("$(VPY)" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	    echo "$(CURDIR)" > "$$own_site/_workbench_0src.pth"
	    "$(VPY)" -c 'import workbench.provenance'
	  fi
	else
	  echo "setup: installing $(CPU_TORCH) (CPU build, local disk)"
	  "$(VPY)" -m pip install -q "$(CPU_TORCH)"
	  echo "setup: installing the project with extras [$(EXTRAS)] (about 2 minutes the first time)"
	  "$(VPY)" -m pip install -q -e '.[$(EXTRAS)]'
	fi
	touch "$@"
	echo "setup: done ($(VENV))"

test: setup ## run the test suite: the fast set; FULL=1 adds the slow tests, as CI does (PYTEST_ARGS="...", TEST_WORKERS=N)
	"$(VPY)" -m pytest -q -n $(TEST_WORKERS) $(if $(filter 1,$(FULL)),,-m "not slow") $(PYTEST_ARGS)

# The set-up is what ran from make's start to this recipe; the report's last line says where the page is and what
# each stage took (set-up, sweep, page).
report: setup ## the main job: reuse this commit's newest finished default sweep (or run one), then build results/report/index.html
	@export WORKBENCH_SETUP_SECONDS=$$(( $$(date +%s) - $(MAKE_START) ))
	"$(VPY)" -m workbench report $(REPORT_ARGS)

sweep: setup ## run the studies' notebooks into a new results/<run>/ folder (pass SWEEP_ARGS="...")
	"$(VPY)" -m workbench sweep $(SWEEP_ARGS)

lab: setup ## register the "Python (workbench)" kernel inside $(VENV) and start JupyterLab on notebooks/
	@"$(VPY)" -m ipykernel install --sys-prefix --name workbench --display-name "Python (workbench)"
	flags=""
	if [ -z "$${DISPLAY:-}" ]; then flags="$$flags --no-browser"; fi
	if [ "$$(id -u)" = 0 ]; then flags="$$flags --allow-root"; fi
	exec "$(VPY)" -m jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks $$flags $(LAB_ARGS)

wheels: ## download the offline bundle $(WHEELS_DIR)/ (Python 3.12, manylinux x86_64) of what the GPU image lacks
	@rm -rf "$(WHEELS_DIR)"
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform any \
	  -d "$(WHEELS_DIR)" -r "$(WHEEL_LIST)"
	echo "wheels: $$(ls "$(WHEELS_DIR)"/*.whl | wc -l) wheels, $$(du -sh "$(WHEELS_DIR)" | cut -f1) in $(WHEELS_DIR)/ (from $(WHEEL_LIST))"
	echo "wheels: on the GPU host, run:"
	echo "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(WHEELS_DIR)/*.whl && export PYTHONPATH=/tmp/site JUPYTER_PATH=/tmp/site/share/jupyter"

clean: ## remove caches (the report's drawings too), build artefacts and results/report/ (never deletes finished run folders under results/)
	find . -path "./$(VENV)" -prune -o -path ./.git -prune -o \
	  \( -name __pycache__ -o -name .pytest_cache -o -name .ipynb_checkpoints -o -name '*.egg-info' \) \
	  -type d -print0 | xargs -0 rm -rf
	rm -rf build dist results/report results/.cache

distclean: clean ## clean, and also remove $(VENV) (run folders under results/ and $(WHEELS_DIR)/ are kept)
	rm -rf "$(VENV)"
