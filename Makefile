# PipeFill operator: developer and CI entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGES := $(VENV)/.packages
# Tests run on 2 cores; this keeps torch from oversubscribing them.
export OMP_NUM_THREADS ?= 1
# Binaries the tests run, cached across worktrees and clones (tests read the same variable).
export PIPEFILL_BINS ?= $(HOME)/.cache/pipefill/bins
# mypy's cache, shared by worktrees and clones like the binaries: mypy checks each cached module against its file
# (size, then content hash where the path or mtime differ), so a fresh clone reuses what is unchanged (99 s cold here,
# 3 s warm, docs/benchmarks.md).
MYPY_CACHE ?= $(HOME)/.cache/pipefill/mypy
# Bytecode is written where a module is first imported and read after, Python's default, also where the environment
# sets PYTHONDONTWRITEBYTECODE (as these machines do): otherwise every process that imports torch (3 s here) would
# compile it again, and the tests and the demo start hundreds. This replaces compiling the whole venv at install
# (63 s of a fresh clone's set-up, most of it modules nothing imports); a stale file is compiled again at import,
# never run stale. The venv's install imports the heavy ones once, so that no test or demo pays for them: what
# `pipefill local`'s launcher preloads for every trainer and fill executor (its PRELOAD), the CLI and the operator's.
unexport PYTHONDONTWRITEBYTECODE
WARM_IMPORTS := import importlib, pipefill.cli, kopf, kubernetes; from pipefill.local.launcher import PRELOAD; \
  [importlib.import_module(m) for m in PRELOAD]
# Prometheus for tests/dashboards: Debian's package (seconds to fetch); where it is not available, built from
# cluster/tools/prometheus (Prometheus 3.16.0, minutes, once). docs/dashboards.md says why.
PROMETHEUS_DEB := 2.42.0+ds-5+deb12u1
PROMETHEUS_DIR := $(PIPEFILL_BINS)/prometheus
# Images: `make images` tags them $(REGISTRY)/{operator,trainer,fill}:<the chart's appVersion>, the tags the spec
# defaults and the chart name (tests/images checks that they agree).
ENGINE ?= docker
REGISTRY ?= ghcr.io/pipefill
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/pipefill/Chart.yaml)
DOCKERFILES := operator/Dockerfile trainer-image/Dockerfile fill-image/Dockerfile

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-17s %s\n", $$1, $$2}'

# uv installs the lock: its parallel downloads and installs take half of pip's time on a fresh clone (71 s
# against 154 s here, docs/benchmarks.md). It takes what pip would: a CPU build of torch where PIP_FIND_LINKS has
# one, PIP_INDEX_URL where one is set. pip stays in the venv, pinned, for what the tests and users run with it.
UV_VERSION := 0.13.9
PIP_VERSION := 26.3
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python --system-certs $(if $(PIP_INDEX_URL),--index-url $(PIP_INDEX_URL)) \
  $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))

# Two stamps: the packages installed, then the heavy imports warmed (bytecode written once). Lint needs only the
# first, so `make test` lints while the second imports torch (26 s of one core on a fresh clone, the other idle).
$(PACKAGES): pyproject.toml requirements/lock.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)
	$(UV_INSTALL) pip==$(PIP_VERSION) -r requirements/lock.txt
	$(UV_INSTALL) --no-deps -e .
	touch $(PACKAGES)

$(STAMP): $(PACKAGES)
	$(BIN)/python -c '$(WARM_IMPORTS)'
	touch $(STAMP)

venv: $(STAMP) ## create .venv with the pinned dependencies (CPU torch 2.13.0)

lint: $(PACKAGES) ## ruff, mypy (strict on the core), import contracts, CRDs and dashboards up to date, hadolint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)
	$(BIN)/lint-imports
	$(BIN)/pipefill crds --check crds/ --chart charts/pipefill/templates/crds/ --docs docs/api.md
	$(BIN)/python -m pipefill.dashboards --check charts/pipefill/dashboards/ --rules charts/pipefill/rules/pipefill.rules.yaml
	$(BIN)/hadolint $(DOCKERFILES)

demo: $(STAMP) ## train a 2-stage GPT on CPU and fill its bubbles with an inference FillJob (pipefill local)
	rm -rf runs/cpu-demo runs/fill/embed-corpus
	$(BIN)/pipefill local -f examples/cpu-demo.yaml -f examples/fill-inference.yaml --out runs/cpu-demo

demo-hf: $(STAMP) ## train a Llama-style model from its Hugging Face config (random init, 2 stages) and fill its bubbles
	rm -rf runs/hf-demo runs/fill/embed-corpus
	$(BIN)/pipefill local -f examples/hf-demo.yaml -f examples/fill-inference.yaml --out runs/hf-demo

demo-embed: $(STAMP) ## the demo's training made wider, its bubbles filled with sentence embeddings by a pretrained MiniLM (embeddings extra)
	rm -rf runs/embed-demo runs/fill/embed-sentences
	$(BIN)/pipefill local -f examples/embed-demo.yaml -f examples/fill-embed.yaml --out runs/embed-demo

# On a machine with one NVIDIA GPU (docs/gpu.md): each part fits in 10 minutes; results under runs/gpu-check.
PART ?= all
gpu-check: $(STAMP) ## the GPU checks and benchmarks, PART=1, 2, 3 or all (docs/gpu.md); DEVICE=cpu: the dry run
	$(BIN)/pipefill gpu-check --part $(PART) --device $(or $(DEVICE),cuda) --out runs/gpu-check

# Two pytest-xdist workers, a file each at a time: most tests wait more than they compute, so two share the 2 cores
# that one leaves half idle; a test marked `alone` (both cores busy, or a quiet core timed) runs with no other beside
# it (tests/sharing.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: ## lint (beside the venv's warm imports), build/fetch the control plane's and Prometheus' binaries if missing (all at once), then the tests
	@$(MAKE) --no-print-directory -j3 lint $(STAMP) cluster-bins prometheus-bin
	$(BIN)/pytest -q --durations=25 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# No venv needed (bins.py is standard library only): `make test` builds these while pip fills the venv and lint runs.
# runc is the one built with cgo: it needs a C compiler and libseccomp's headers (Debian's libseccomp-dev, installed
# here when missing and we are root).
cluster-bins: libseccomp ## build the control plane (etcd, kube-*, kwok), helm and the real node (kubelet, containerd, runc, pause) from Go modules (cached)
	$(PYTHON) -P pipefill/devcluster/bins.py

libseccomp:
	@pkg-config --exists libseccomp 2>/dev/null || { [ "$$(id -u)" = 0 ] && { apt-get install -y -qq libseccomp-dev >/dev/null 2>&1 \
	  || { apt-get update -qq && apt-get install -y -qq libseccomp-dev >/dev/null; }; }; } \
	  || echo "make cluster-bins: no libseccomp-dev (apt-get install libseccomp-dev): runc, and so the real node, will not build" >&2

chart-check: $(STAMP) cluster-bins ## the chart's checks alone (tests/chart): helm lint, renders, server-side dry runs, install/upgrade/uninstall
	$(BIN)/pytest -q tests/chart

cluster: $(STAMP) ## start a control plane with kwok GPU nodes on loopback in the background; prints export KUBECONFIG=…
	@$(BIN)/pipefill cluster up --dir .cluster

cluster-node: $(STAMP) ## `make cluster` plus one real node (kubelet, containerd, runc) that really runs pods; root only
	@$(BIN)/pipefill cluster up --dir .cluster --kubelet

cluster-down: $(STAMP) ## stop the control plane that `make cluster` started (and its real node, undoing its changes to the host)
	$(BIN)/pipefill cluster down --dir .cluster

crds: $(STAMP) ## regenerate crds/, the chart's CRD templates and docs/api.md from the spec models
	$(BIN)/pipefill crds --write crds/ --chart charts/pipefill/templates/crds/ --docs docs/api.md

dashboards: $(STAMP) ## render the Grafana dashboards (pipefill/dashboards) into charts/pipefill/dashboards/
	$(BIN)/python -m pipefill.dashboards --write charts/pipefill/dashboards/ --rules charts/pipefill/rules/pipefill.rules.yaml

dashboard-images: $(STAMP) prometheus-bin ## redraw docs/img/dashboard-*.png from a real scrape of a short local run
	PIPEFILL_DASHBOARD_IMAGES=docs/img $(BIN)/pytest -q tests/dashboards/test_prometheus.py

# ENGINE=buildah needs no daemon (Debian's buildah and debootstrap): pipefill/devcluster/images.py builds the same
# Dockerfiles on a base it makes here (no registry image can be pulled on this project's machines), cached by the hash
# of their inputs; standard library only, like bins.py. IMAGES=operator picks some; BASE=<image> builds on another base.
# TORCH=cpu builds the trainer and fill images with PyPI's torch but none of its CUDA wheels (images-load's default:
# the real node has no GPU); TORCH=cuda (the default of `images`) with them.
IMAGES ?= operator,trainer,fill
TORCH ?=
images: ## build the three images (ENGINE=docker or podman; ENGINE=buildah: no daemon, a local base, cached by their inputs)
ifeq ($(ENGINE),buildah)
	$(PYTHON) -P pipefill/devcluster/images.py --registry $(REGISTRY) --tag $(IMAGE_TAG) --only $(IMAGES) $(if $(BASE),--base $(BASE)) $(if $(TORCH),--torch $(TORCH))
else
	@command -v $(ENGINE) >/dev/null || { echo "make images: '$(ENGINE)' not found; set ENGINE=podman or ENGINE=buildah, or install a container engine" >&2; exit 2; }
	$(ENGINE) build -f operator/Dockerfile -t $(REGISTRY)/operator:$(IMAGE_TAG) .
	$(ENGINE) build -f trainer-image/Dockerfile --build-arg TORCH=$(or $(TORCH),cuda) -t $(REGISTRY)/trainer:$(IMAGE_TAG) .
	$(ENGINE) build -f fill-image/Dockerfile --build-arg TORCH=$(or $(TORCH),cuda) -t $(REGISTRY)/fill:$(IMAGE_TAG) .
endif

images-load: $(STAMP) ## build the images with buildah (as ENGINE=buildah) and import them into the real node of `make cluster-node`
	$(BIN)/python -m pipefill.devcluster.images --registry $(REGISTRY) --tag $(IMAGE_TAG) --only $(IMAGES) $(if $(BASE),--base $(BASE)) $(if $(TORCH),--torch $(TORCH)) --load .cluster

# Minutes the first time (the images' builds), about one more once they are cached; root, buildah and debootstrap.
e2e: $(STAMP) cluster-bins ## the product on a real node (tests/e2e): CPU images, helm install, the CPU demo as real rank pods, faults
	PIPEFILL_E2E=1 CI=true $(BIN)/pytest -q -p no:cacheprovider tests/e2e

prometheus-bin: ## Prometheus and promtool into PIPEFILL_BINS/prometheus/ (default ~/.cache/pipefill/bins), once
	@test "$$(cat "$(PROMETHEUS_DIR)/VERSION" 2>/dev/null)" = "$(PROMETHEUS_DEB)" || $(MAKE) --no-print-directory fetch-prometheus

fetch-prometheus:
	mkdir -p "$(PIPEFILL_BINS)"
	set -e; tmp=$$(mktemp -d "$(PIPEFILL_BINS)/.prometheus.XXXXXX"); trap 'rm -rf "$$tmp"' EXIT; \
	if (cd "$$tmp" && apt-get download -qq prometheus=$(PROMETHEUS_DEB) 2>/dev/null) \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && (cd "$$tmp" && apt-get download -qq prometheus=$(PROMETHEUS_DEB)); }; then \
	  dpkg-deb -x "$$tmp"/prometheus_*.deb "$$tmp/root"; mkdir "$$tmp/bin"; \
	  mv "$$tmp/root/usr/bin/prometheus" "$$tmp/root/usr/bin/promtool" "$$tmp/bin/"; \
	else \
	  echo "Debian's prometheus $(PROMETHEUS_DEB) is not available here: building Prometheus from cluster/tools/prometheus (minutes, once)"; \
	  (cd cluster/tools/prometheus && GOFLAGS="-buildvcs=false -tags=remove_all_sd" go build -trimpath -o "$$tmp/bin/" \
	    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool); \
	fi; \
	echo "$(PROMETHEUS_DEB)" > "$$tmp/bin/VERSION"; rm -rf "$(PROMETHEUS_DIR)"; mv -T "$$tmp/bin" "$(PROMETHEUS_DIR)"
	"$(PROMETHEUS_DIR)/prometheus" --version | head -1

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lock: ## re-resolve requirements/lock.txt in a scratch venv
	rm -rf /tmp/pipefill-lock && $(PYTHON) -m venv /tmp/pipefill-lock
	/tmp/pipefill-lock/bin/pip install -q torch==2.13.0 'setuptools>=77' -e '.[operator,trainer,fill,local,dashboards,embeddings,huggingface,data,torchtitan,dev]'
	/tmp/pipefill-lock/bin/pip freeze --all --exclude-editable | grep -v '^torch==\|^pip==' | sed '1i torch==2.13.0' > requirements/lock.txt

clean: ## remove the venv and caches
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info

.PHONY: help venv demo demo-hf demo-embed lint test crds dashboards dashboard-images images images-load prometheus-bin fetch-prometheus fmt lock clean
.PHONY: cluster-bins libseccomp cluster cluster-node cluster-down chart-check gpu-check e2e
