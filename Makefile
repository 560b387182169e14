# rlkube developer entry points. `make demo` runs the main job; `make test` is what CI runs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3
VENV       ?= .venv
PY         := $(VENV)/bin/python
# Every cache of the project is under RLKUBE_CACHE (default ~/.cache/rlkube): binaries, wheels, images,
# buildah storage, the Docker engine's data root. Point it at an empty folder for a cold start.
RLKUBE_CACHE ?= $(HOME)/.cache/rlkube
CACHE      ?= $(RLKUBE_CACHE)
WHEELS     := $(CACHE)/wheels
# torch from PyPI is a multi-GB CUDA build (it runs on CPU too); it is downloaded once into
# $(WHEELS) and installed from there on every later setup.
TORCH_VERSION ?= 2.11.0
PYTEST     := $(PY) -m pytest -p no:cacheprovider

.PHONY: help setup lint unit test-random crds crds-check integration e2e test demo cluster-up cluster-down clean
.PHONY: chart-crds chart-rbac chart-lint
.PHONY: cluster-bins cluster-status images
.PHONY: training-tests soak
.PHONY: kind-bins kind-node-image docker-up docker-down kind-teardown-test

help:
	@echo "make demo         local cluster + operator (Helm) + tiny DPO job trained on CPU stubs"
	@echo "make test         everything CI runs: lint, unit, crds-check, integration, e2e"
	@echo "make setup        .venv with rlkube[operator,runtime,dev] (torch wheel cached in $(WHEELS))"
	@echo "make test-random  the unit tier in a new random order (the seed is shown; make unit TEST_SEED=N replays it)"
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

# Size limits under operator/ and runtime/: file 600, function 80, class 300 lines (docs/contributing.md);
# tests/lint/size_allowlist.txt excuses what is being split today.
lint: setup
	$(PY) -m ruff check operator runtime tests
	$(VENV)/bin/lint-imports
	$(PY) tests/lint/check_sizes.py

# Test order: the unit and training tiers run shuffled by pytest-randomly (dev extra; off in a plain
# pytest run, pyproject.toml) with a fixed seed, so every run and CI take the same order and a test
# that leans on one before it fails every time, not one run in ten. `make unit TEST_SEED=N` replays
# an order, `make test-random` draws a new seed for the unit tier (shown first; replay it with TEST_SEED).
TEST_SEED ?= 41
unit: setup
	@echo "unit: random order, --randomly-seed=$(TEST_SEED)"
	$(PYTEST) -p randomly --randomly-seed=$(TEST_SEED) tests/unit -q

test-random: setup
	@seed=$$(( RANDOM * 32768 + RANDOM )); echo "test-random: --randomly-seed=$$seed (replay: make unit TEST_SEED=$$seed)"; \
	  $(PYTEST) -p randomly --randomly-seed=$$seed tests/unit -q

crds: setup
	$(VENV)/bin/rlkube crd --out crds/

crds-check: setup
	$(VENV)/bin/rlkube crd --check crds/

# The chart carries the CRDs in its own crds/ folder (Helm installs them before the templates). A
# symlink does not survive `helm package`, so they are copied from the one source, crds/; a unit
# test fails when the copies differ.
chart-crds:
	rm -f charts/rlkube/crds/*.yaml
	cp crds/*.yaml charts/rlkube/crds/

# The chart's Role/ClusterRole rules are generated from rlkube.operator.controller.rbac (the operator's needs,
# verb by verb); a unit test fails when charts/rlkube/files/rbac.yaml is stale.
chart-rbac: setup
	$(PY) charts/rlkube/hack/render_rbac.py

# helm is the harness's, built from its Go module (tests/cluster/bins.py builds it when missing).
HELM = $$($(PY) -c 'from tests.cluster import bins; print(bins.helm())')

chart-lint: setup
	helm="$(HELM)" && "$$helm" lint --strict charts/rlkube

integration: setup
	@if ls tests/integration/test_*.py >/dev/null 2>&1; then $(PYTEST) tests/integration -q; else echo "integration: no tests yet"; fi

# Real nodes and pods: the chart installed by Helm, the tiny DPO, GRPO and PPO jobs on CPU stubs,
# kill/resume, suspend/resume, helm upgrade and uninstall, Kueue quota and preemption (tests/e2e,
# docs/demo.md, docs/kueue.md). The operator and runtime images are built on first use, cached by
# input hash.
e2e: setup
	$(PYTEST) tests/e2e -q --timeout=1800 --durations=8

# Real local cluster from official sources (tests/cluster, docs/cluster.md). CLUSTER_MODE=full
# (two kubelet nodes, DNS, fake GPUs) or control-plane (etcd, apiserver, controllers only).
# Stdlib Python only, so it works before `make setup`. The first run builds the binaries.
CLUSTER_MODE ?= full
cluster-bins:
	tests/cluster/build-bins.sh

cluster-up:
	$(PYTHON_SYS) tests/cluster/cluster.py up --mode $(CLUSTER_MODE)

cluster-down:
	$(PYTHON_SYS) tests/cluster/cluster.py down
	$(PYTHON_SYS) tests/cluster/docker_engine.py down

# The kind path (issue 19, docs/cluster.md "The kind path"): `RLKUBE_CLUSTER=kind make cluster-up`,
# `... make demo`, `... make e2e` run on a kind cluster instead of the harness's. kind, kubeadm,
# kube-proxy, CoreDNS and the runc-caps wrapper built from their Go modules (kind-bins), a node
# image built here with no registry (kind-node-image), the project's own Docker engine (Debian's
# docker.io, installed when missing; no iptables rules, the host's FORWARD policy untouched).
# docker-down (also run by cluster-down) stops only an engine the project started and fails when
# the host's firewall differs from what it recorded. kind-teardown-test checks that, and that
# cluster-down leaves nothing of a kind cluster (root, ~3 min; run it under the cluster lock).
# None of this is part of `make test`.
kind-bins:
	tests/cluster/kind-bins.sh

kind-node-image:
	$(PYTHON_SYS) tests/cluster/kindnode.py

docker-up:
	$(PYTHON_SYS) tests/cluster/docker_engine.py up

docker-down:
	$(PYTHON_SYS) tests/cluster/docker_engine.py down

kind-teardown-test: setup
	$(PYTEST) tests/kind -q -s --timeout=900

cluster-status:
	$(PYTHON_SYS) tests/cluster/cluster.py status

# The images the local cluster runs (the CUDA `runtime` image needs its public base and a GPU build).
LOCAL_IMAGES ?= pause smoke operator runtime-cpu
images:
	for n in $(LOCAL_IMAGES); do \
	  $(PYTHON_SYS) -c "import sys; sys.path.insert(0, '.'); from tests.cluster import images; print(images.build('$$n'))"; done

training-tests: setup
	@echo "training-tests: random order, --randomly-seed=$(TEST_SEED)"
	$(PYTEST) -p randomly --randomly-seed=$(TEST_SEED) tests/training -q

test: lint unit crds-check training-tests integration e2e

# The README's main job: local cluster, images, `helm install`, the tiny DPO job to Succeeded,
# its status and events (tests/e2e/demo.py, docs/demo.md). The cluster stays up afterwards.
DEMO_TIMEOUT ?= 900
demo: setup
	$(PY) -m tests.e2e.demo --timeout $(DEMO_TIMEOUT)

# The chaos soak (tests/soak, docs/scheduling.md "Chaos soak"): small jobs on the local cluster while a
# seeded driver kills trainers and the operator, stops kubelets and restarts the API server; then
# every job Succeeded, no duplicate pod, steps lost per fault <= the checkpoint interval, no orphans.
# Not in `make test` (about 15-20 minutes). SOAK_ARGS e.g. "--seed 3 --jobs 6 --faults 8 --duration 600".
SOAK_ARGS ?=
soak: setup
	$(PY) -m tests.soak.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
