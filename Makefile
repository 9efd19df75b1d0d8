# netsense: make run (the quick job), make test (the whole suite), make lint.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml operator/pyproject.toml | sha1sum | cut -c1-12)
# The CUDA build of torch from PyPI is several GB; pip's cache (~/.cache/pip) keeps
# later installs offline-fast.
PIP_FLAGS ?= --disable-pip-version-check

.PHONY: help venv deps deps-node run test test-fast lint fmt envtest manifests node node-up node-down e2e kind-e2e kind-down gpu-check bench results clean

help:
	@echo "make run        set up .venv and run the quick NetSenseJob on the emulated cluster (root)"
	@echo "make test       set up .venv, the Debian packages and the envtest control plane, then run every test"
	@echo "make test-fast  the pure units and one 2-rank DDP hook test, under 2 minutes: no root, no API server, no Go"
	@echo "make lint       ruff"
	@echo "make envtest    build kube-apiserver, etcd and kubectl into ~/.cache/netsense/envtest"
	@echo "make manifests  regenerate manifests/base/crd.yaml and admission-policy.yaml from the spec"
	@echo "make bench      the CI-sized benchmark grid (testbed/grids/ci.yaml)"
	@echo "make results    the final run: every evaluation grid on one commit (testbed/rerun.sh; hours; resumes)"
	@echo "make node       build a real one-node cluster's parts and images (testbed/node; root)"
	@echo "make node-up    run that node in the foreground (Ctrl-C tears it down); node-down sweeps leftovers"
	@echo "make e2e        the operator end to end on that node: real pods, images, shaping, faults (root)"
	@echo "make kind-e2e   3-node kind cluster (node image built here) and the multi-node tests (root; KEEP=1 keeps it)"
	@echo "make kind-down  delete a kept kind cluster and stop its dockerd (testbed/kind/dockerd.sh)"
	@echo "make gpu-check  the GPU path on this machine's GPU (testbed/gpu/check.sh; dry on the CPU without one)"

$(STAMP): pyproject.toml operator/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_FLAGS) -q --upgrade pip
	$(BIN)/pip install $(PIP_FLAGS) -q -e '.[train,cluster,dev]' -e ./operator
	rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

# What the emulated cluster and the tests need from Debian (testbed/install-deps.sh: only what is missing).
deps:
	@bash testbed/install-deps.sh

deps-node:
	@bash testbed/install-deps.sh --node

run: venv deps
	$(BIN)/netsense run samples/quick.yaml --out runs/quick

envtest: deps
	@NETSENSE_NEED_GO=1 bash testbed/install-deps.sh
	@bash testbed/envtest/build.sh >/dev/null

test: venv envtest
	KUBEBUILDER_ASSETS=$$(bash testbed/envtest/build.sh) $(BIN)/pytest -q -ra --durations=15

test-fast: venv
	$(BIN)/pytest -q -m "not root and not apiserver and not slow and not e2e and (not gloo or fast)" --durations=10

lint: venv
	$(BIN)/ruff check netsense tests testbed operator

fmt: venv
	$(BIN)/ruff check --fix netsense tests testbed operator

manifests: venv
	$(BIN)/netsense crd > manifests/base/crd.yaml
	$(BIN)/netsense admission-policy > manifests/base/admission-policy.yaml

bench: venv
	$(BIN)/netsense bench testbed/grids/ci.yaml --out runs/bench-ci

results: venv
	bash testbed/rerun.sh $(GRIDS)

# The Go builds (CPU) and the image builds (mostly network and disk) run side by side.
node: venv deps-node envtest
	@bash testbed/envtest/build.sh --node >/dev/null & go=$$!; \
	bash testbed/node/images.sh build; images=$$?; wait $$go && exit $$images

node-up: node
	cd tests && ../$(BIN)/python -m support.node up

node-down: venv
	cd tests && ../$(BIN)/python -m support.node down

e2e: node
	$(BIN)/pytest -q -ra -s -m "e2e and not kind" --timeout 1200 --durations=15 tests/e2e

# testbed/kind/e2e.sh: dockerd, the node image, the cluster, the tests, and the teardown (README there).
kind-e2e: venv deps-node envtest
	bash testbed/kind/e2e.sh

kind-down:
	if [[ -x /run/netsense-kind/bin/kind ]]; then PATH=/run/netsense-kind/bin:$$PATH DOCKER_HOST=unix:///run/netsense-kind/docker.sock \
	  kind delete cluster --name $${CLUSTER:-netsense-e2e} || true; fi
	bash testbed/kind/dockerd.sh stop

gpu-check:
	bash testbed/gpu/check.sh

clean:
	rm -rf runs .pytest_cache .ruff_cache
	-$(BIN)/netsense clean
