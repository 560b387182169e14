# rlkube developer entry points. `make demo` runs the main job; `make test` is what CI runs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3
VENV       ?= .venv
PY         := $(VENV)/bin/python
CACHE      ?= $(HOME)/.cache/rlkube
WHEELS     := $(CACHE)/wheels
# torch from PyPI is a multi-GB CUDA build (it runs on CPU too); it is downloaded once into
# $(WHEELS) and installed from there on every later setup.
TORCH_VERSION ?= 2.11.0
PYTEST     := $(PY) -m pytest -p no:cacheprovider

.PHONY: help setup lint unit crds crds-check integration e2e test demo cluster-up cluster-down clean

help:
	@echo "make demo         local cluster + operator (Helm) + tiny DPO job trained on CPU stubs"
	@echo "make test         everything CI runs: lint, unit, crds-check, integration, e2e"
	@echo "make setup        .venv with rlkube[operator,runtime,dev] (torch wheel cached in $(WHEELS))"
	@echo "make cluster-up   real local cluster from official sources (tests/cluster)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	mkdir -p $(WHEELS)
	ls $(WHEELS)/torch-$(TORCH_VERSION)-*.whl >/dev/null 2>&1 || \
	  $(PY) -m pip download -q --only-binary=:all: -d $(WHEELS) torch==$(TORCH_VERSION)
	$(PY) -m pip install -q --no-index --find-links $(WHEELS) torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[operator,runtime,dev]'
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(PY) -m ruff check operator runtime tests
	$(VENV)/bin/lint-imports

unit: setup
	$(PYTEST) tests/unit -q

crds: setup
	$(VENV)/bin/rlkube crd --out crds/

crds-check: setup
	$(VENV)/bin/rlkube crd --check crds/

integration: setup
	@if ls tests/integration/test_*.py >/dev/null 2>&1; then $(PYTEST) tests/integration -q; else echo "integration: no tests yet"; fi

e2e: setup
	@if ls tests/e2e/test_*.py >/dev/null 2>&1; then $(PYTEST) tests/e2e -q; else echo "e2e: no tests yet"; fi

test: lint unit crds-check integration e2e

demo: setup
	@echo "make demo: the end-to-end demo (cluster + Helm + tiny DPO job) is not built yet; see README"; exit 1

clean:
	rm -rf $(VENV) build *.egg-info
