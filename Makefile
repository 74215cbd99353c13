# PipeFill operator: developer and CI entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tests run on 2 cores; this keeps torch from oversubscribing them.
export OMP_NUM_THREADS ?= 1

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements/lock.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/lock.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP) ## create .venv with the pinned dependencies (CPU torch 2.13.0)

lint: $(STAMP) ## ruff, mypy (strict on the core), import contracts, CRDs up to date
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pipefill crds --check crds/ charts/pipefill/crds/ --docs docs/api.md

demo: $(STAMP) ## train a 2-stage GPT on CPU and fill its bubbles with an inference FillJob (pipefill local)
	rm -rf runs/cpu-demo runs/fill/embed-corpus
	$(BIN)/pipefill local -f examples/cpu-demo.yaml -f examples/fill-inference.yaml --out runs/cpu-demo

test: lint cluster-bins ## lint, build the control plane's binaries if missing, then the whole test suite
	$(BIN)/pytest -q

cluster-bins: $(STAMP) ## build etcd, kube-apiserver/-controller-manager/-scheduler, kwok and helm from Go modules (cached)
	$(BIN)/pipefill cluster bins

cluster: $(STAMP) ## start a control plane with kwok GPU nodes on loopback in the background; prints export KUBECONFIG=…
	@$(BIN)/pipefill cluster up --dir .cluster

cluster-down: $(STAMP) ## stop the control plane that `make cluster` started
	$(BIN)/pipefill cluster down --dir .cluster

crds: $(STAMP) ## regenerate crds/ from the spec models
	$(BIN)/pipefill crds --write crds/ charts/pipefill/crds/ --docs docs/api.md

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lock: ## re-resolve requirements/lock.txt in a scratch venv
	rm -rf /tmp/pipefill-lock && $(PYTHON) -m venv /tmp/pipefill-lock
	/tmp/pipefill-lock/bin/pip install -q torch==2.13.0 -e '.[operator,trainer,fill,local,dev]'
	/tmp/pipefill-lock/bin/pip freeze --exclude-editable | grep -v '^torch==' | sed '1i torch==2.13.0' > requirements/lock.txt

clean: ## remove the venv and caches
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info

.PHONY: help venv demo lint test crds fmt lock clean cluster-bins cluster cluster-down
