# notes-exports — every target sets up what it needs (venv, OS packages) by itself.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

PYTEST_ARGS ?=

.PHONY: help
help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Lock files (docs/development.md "Lock files"): every third-party package is installed from
# a lock with hashes (pip --require-hashes --no-deps), then the three local packages (the
# library exportcore, the command line exportctl, the processes' services) from their paths
# with --no-deps. requirements.lock is what running needs (make dev, the image);
# requirements-dev.lock adds the test and lint tools (make test, make lint).
RUNTIME_LOCK  := requirements.lock
DEV_LOCK      := requirements-dev.lock
BENCH_LOCK    := requirements-bench.lock
RUNTIME_STAMP := $(VENV)/.installed-runtime
LOCAL_SOURCES := pyproject.toml libs/exportcore/pyproject.toml libs/exportctl/pyproject.toml

define install_locked
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r $(1)
	@# exportcore first, on its own: a venv from before exportctl was a package of its own has
	@# the exportctl script in exportcore's record, and replacing exportcore removes it.
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e libs/exportcore
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
	  -e libs/exportctl -e .
	$(BIN)/python -m pip check || { echo "$(1) lacks a dependency of the pyproject files: run make lock" >&2; exit 1; }
endef

$(RUNTIME_STAMP): $(RUNTIME_LOCK) $(LOCAL_SOURCES)
	$(call install_locked,$(RUNTIME_LOCK))
	touch $@

$(STAMP): $(DEV_LOCK) $(RUNTIME_LOCK) $(LOCAL_SOURCES)
	$(call install_locked,$(DEV_LOCK))
	touch $@ $(RUNTIME_STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install from requirements-dev.lock (hashes) + the local packages, editable

.PHONY: install-runtime
install-runtime: $(RUNTIME_STAMP) ## Only what running needs (requirements.lock): what make dev installs

# `make lock` keeps every pin that still satisfies the pyproject ranges; UPGRADE=1 re-resolves
# to the newest allowed versions, UPGRADE_PACKAGE=name one package. Resolved for the image's
# platform (CPython 3.11, Linux x86_64) whatever machine runs it.
UV              ?= $(BIN)/uv
UPGRADE         ?=
UPGRADE_PACKAGE ?=
LOCK_FLAGS = --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
             --no-emit-package exportcore --no-emit-package exportctl --no-emit-package notes-exports --custom-compile-command "make lock" \
             $(if $(filter-out 0,$(UPGRADE)),--upgrade) $(foreach p,$(UPGRADE_PACKAGE),--upgrade-package $(p))

# The runtime lock covers the processes (pyproject.toml, which pulls exportcore) and the
# command line the image ships for operators (libs/exportctl/pyproject.toml).
LOCK_INPUTS = pyproject.toml libs/exportctl/pyproject.toml requirements-build.in

.PHONY: lock
lock: ## Refresh requirements.lock, requirements-dev.lock and requirements-bench.lock with hashes (uv; UPGRADE=1, UPGRADE_PACKAGE=name)
	@# uv comes from the current dev lock (hashes checked); no `pip check` here, since the
	@# pyproject files may already name what the lock is about to gain.
	test -x $(UV) || { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	  $(BIN)/python -m pip install -q --require-hashes --no-deps -r $(DEV_LOCK); }
	$(UV) pip compile $(LOCK_FLAGS) $(LOCK_INPUTS) -o $(RUNTIME_LOCK)
	$(UV) pip compile $(LOCK_FLAGS) $(LOCK_INPUTS) --extra dev \
	  --constraint $(RUNTIME_LOCK) -o $(DEV_LOCK)
	@# the benchmark's peers (the bench extra), at the dev lock's versions of what they share
	$(UV) pip compile $(LOCK_FLAGS) $(LOCK_INPUTS) --extra bench \
	  --constraint $(DEV_LOCK) -o $(BENCH_LOCK)

.PHONY: os-packages
os-packages: ## Install PostgreSQL and Redis from the OS packages when absent
	bash scripts/localstack.sh os-packages

.PHONY: dev
# DEV_S3=1 runs moto (a test tool) as the S3 server: that needs the dev lock.
dev: $(if $(filter 1,$(DEV_S3) $(DEV_HA)),$(STAMP),$(RUNTIME_STAMP)) os-packages ## Run the whole stack locally (PostgreSQL, Redis, api, publisher, workers)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/dev.sh

.PHONY: browser
browser: ## Install Debian's chromium (and a font) for the browser tests (console, offline /docs) when missing
	bash scripts/localstack.sh os-packages chromium fonts-dejavu-core

# `make test` runs on TEST_WORKERS pytest-xdist workers (docs/development.md "Tests"): each has
# its own PostgreSQL + Redis (.test/gwN/, ports TEST_PG_PORT/TEST_REDIS_PORT + 1 + N), and
# a module stays on one worker, the longest modules first (tests/xdist_groups.py). The suite
# mostly waits (processes starting, leases expiring, drills' recovery), so 4 workers pay on 2
# cores. PYTEST_ARGS="-n 0" runs it serially (on .test/ and the base ports). Bytecode is
# written even where PYTHONDONTWRITEBYTECODE is set: every worker, and every process the
# tests start, would otherwise compile the sources again.
TEST_WORKERS ?= 4
PYTEST_RUN = PYTHONDONTWRITEBYTECODE= $(BIN)/pytest

.PHONY: test
test: install os-packages chart-tools browser ## Run the test suite (unit, integration, e2e, console in Chromium) on real PostgreSQL + Redis, TEST_WORKERS=4 in parallel
	$(PYTEST_RUN) -n $(TEST_WORKERS) $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: install os-packages promtool ## Unit and integration tests only (no e2e processes, no chart checks)
	$(PYTEST_RUN) -n $(TEST_WORKERS) -m "not e2e and not chart" $(PYTEST_ARGS)

# ---------------------------------------------------------------------------------------------
# The Grafana dashboards live in grafana/dashboards/ (with grafana/provisioning/, what a
# standalone Grafana reads); Helm reads no file outside the chart, so the chart ships a copy in
# charts/notes-exports/files/dashboards/ that `make dashboards` writes and
# tests/chart/test_grafana.py keeps identical. The Prometheus rules live in the chart
# (files/alerts/); tests/grafana/rules/ holds their promtool tests.
# ---------------------------------------------------------------------------------------------
.PHONY: dashboards
dashboards: install ## Copy grafana/dashboards/*.json into the chart (charts/notes-exports/files/dashboards/)
	$(BIN)/python -m devtools.grafana sync

.PHONY: promtool
promtool: ## Install promtool (Debian package prometheus) when missing
	@command -v promtool >/dev/null 2>&1 || bash scripts/localstack.sh os-packages prometheus

.PHONY: test-grafana
test-grafana: install promtool ## promtool check/test of the alert rules and the dashboard checks
	$(BIN)/pytest -m grafana $(PYTEST_ARGS)

.PHONY: lint
lint: install ## ruff check, ruff format --check, mypy --strict on libs/exportcore, libs/exportctl, services, devtools, bench
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

.PHONY: format
format: install ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: migrate
migrate: install ## Apply migrations to DATABASE_URL
	$(BIN)/exportctl migrate

.PHONY: sql-show
sql-show: install ## Print SQL statements expanded: NAME=job_claim_many (or jobs.job_claim_many, or a file: jobs)
	@test -n "$(NAME)" || { echo "usage: make sql-show NAME=<statement | file.statement | file>" >&2; exit 2; }
	@$(BIN)/python -m exportcore.sql $(NAME)

.PHONY: clean
clean: ## Stop this checkout's make dev stack and test servers (.test/ and each worker's .test/gwN/, by pid files); remove .dev/ and .test/
	-bash scripts/localstack.sh stop-home .dev
	-for d in .test .test/gw*; do [ -d "$$d" ] && bash scripts/localstack.sh stop-home "$$d"; done
	rm -rf .dev .test

# ---------------------------------------------------------------------------------------------
# Benchmarks (docs/performance.md): their own PostgreSQL + Redis under .bench/ (ports 55451 /
# 56391, BENCH_PG_PORT / BENCH_REDIS_PORT), the peers (the pyproject's bench extra) installed
# from requirements-bench.lock with hashes, wrk from the OS packages. They report; they never
# fail on speed.
#   make bench                  every scenario, 3 runs (RUNS=n), table + .bench/results/*.json
#   make bench QUICK=1          small sizes, 1 run: validates the harness in a few minutes
#   make bench ONLY=e2e,api     some scenarios (e2e, costs, api, bulk, scale, console, bulk_replay, recovery, webhooks, fairness)
#   make profile [QUICK=1]      py-spy profiles under steady load into .bench/profiles/
# ---------------------------------------------------------------------------------------------
BENCH_STAMP := $(VENV)/.bench-installed
QUICK       ?=
RUNS        ?=
ONLY        ?=
SYSTEMS     ?=
BENCH_FLAGS = $(if $(filter-out 0,$(QUICK)),--quick) $(if $(RUNS),--runs $(RUNS)) \
              $(if $(ONLY),--only $(ONLY)) $(if $(SYSTEMS),--systems $(SYSTEMS))

$(BENCH_STAMP): $(STAMP) $(BENCH_LOCK)
	$(BIN)/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r $(BENCH_LOCK)
	$(BIN)/python -m pip check || { echo "$(BENCH_LOCK) lacks a dependency of the bench extra: run make lock" >&2; exit 1; }
	touch $@

.PHONY: bench-install
bench-install: $(BENCH_STAMP) os-packages ## Install the benchmark peers, py-spy and psutil (requirements-bench.lock, hashes) and wrk
	bash scripts/localstack.sh os-packages wrk

.PHONY: bench
bench: bench-install ## Benchmarks vs raw Celery, Procrastinate, PgQueuer (QUICK=1 RUNS=n ONLY=e2e,costs,api,bulk,scale,console,bulk_replay,recovery,webhooks,fairness)
	$(BIN)/python -m bench run $(BENCH_FLAGS)

.PHONY: profile
profile: bench-install ## py-spy profiles of api, publisher, scanner and worker under steady load (QUICK=1)
	$(BIN)/python -m bench profile $(if $(filter-out 0,$(QUICK)),--quick)

.PHONY: bench-smoke
bench-smoke: bench-install ## The harness end to end at tiny sizes, as a test (pytest -m bench)
	BENCH_SMOKE=1 $(BIN)/pytest -n 0 -m bench -p no:cacheprovider $(PYTEST_ARGS)

.PHONY: bench-clean
bench-clean: ## Stop the benchmark servers and remove .bench/ (results and profiles included)
	-bash scripts/localstack.sh pg-stop .bench/pg
	-bash scripts/localstack.sh redis-stop .bench/redis
	rm -rf .bench

# ---------------------------------------------------------------------------------------------
# Kubernetes: pinned helm (built with `go install`), schema tooling, chart checks, the
# kind / minikube workflow (docker or podman, kind or minikube, kubectl on your laptop) and
# the test cluster of this machine (cluster-*: a real kubelet, no Docker); docs/kubernetes.md.
# ---------------------------------------------------------------------------------------------
TOOLS            := $(CURDIR)/.tools
HELM_VERSION     ?= v3.22.0
HELM_BIN         := $(TOOLS)/bin/helm
HELM             ?= $(HELM_BIN)
# The Kubernetes version helm renders for when not told (`helm template` offline, without
# --kube-version): what helm's own release build sets from its client-go (v0.37 -> 1.37);
# a plain `go install` would leave helm's fallback, 1.20, which the chart refuses.
HELM_KUBE_MINOR  ?= 37
HELM_STAMP       := $(TOOLS)/bin/.helm-$(HELM_VERSION)-k8s1.$(HELM_KUBE_MINOR)
# helm-docs writes the chart README's values table from the `# --` comments of values.yaml
# (charts/notes-exports/README.md.gotmpl); tests/chart/test_docs.py runs it and fails on drift.
HELM_DOCS_VERSION ?= v1.14.2
HELM_DOCS        := $(TOOLS)/bin/helm-docs
HELM_DOCS_STAMP  := $(TOOLS)/bin/.helmdocs-$(HELM_DOCS_VERSION)
HELM_DOCS_FLAGS   = --chart-search-root $(CHART) --sort-values-order file
# chart-version-check compares the chart with the merge base of HEAD and this ref.
CHART_BASE_REF   ?= main
NPM_TOOLS        := $(TOOLS)/npm
CRD_SCHEMAS      := tests/chart/crd-schemas
CHART            := charts/notes-exports
# chart-lint and chart-template check the oldest Kubernetes the chart supports (Chart.yaml
# kubeVersion >=1.29); plain `helm template` renders for HELM_KUBE_MINOR above.
KUBE_VERSION     ?= 1.29.0
CI_VALUES        := $(wildcard $(CHART)/ci/*-values.yaml)

KIND_CLUSTER     ?= notes-exports
MINIKUBE_PROFILE ?= notes-exports
KUBE_CONTEXT     ?= kind-$(KIND_CLUSTER)
K8S_NAMESPACE    ?= notes-exports
RELEASE          ?= notes-exports
# docker, else podman, else buildah (this machine: its debootstrap base as PYTHON_IMAGE).
CONTAINER_TOOL   ?= $(shell command -v docker >/dev/null 2>&1 && echo docker || { command -v podman >/dev/null 2>&1 && echo podman; } || echo buildah)
IMAGE_REPO       ?= notes-exports
IMAGE_TAG        ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo 0.1.0)
IMAGE            := $(IMAGE_REPO):$(IMAGE_TAG)
DEPLOY_VALUES    ?= k8s/values-kind.yaml
INGRESS_URL      ?= http://localhost:8080
# Envoy Gateway (Gateway API v1.6): the maintained controller of the walkthroughs.
ENVOY_GATEWAY_VERSION ?= v1.9.1
KUBECTL          = kubectl --context $(KUBE_CONTEXT)

$(HELM_STAMP):
	@command -v go >/dev/null 2>&1 || { echo "helm is built with Go (go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)): install Go, or run with HELM=/path/to/helm" >&2; exit 1; }
	mkdir -p $(TOOLS)/bin
	GOBIN=$(TOOLS)/bin GOFLAGS=-buildvcs=false go install \
	  -ldflags "-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_KUBE_MINOR) \
	    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_KUBE_MINOR)" \
	  helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	rm -f $(TOOLS)/bin/.helm-*
	touch $@

.PHONY: helm
helm: $(if $(filter $(HELM_BIN),$(HELM)),$(HELM_STAMP)) ## Build the pinned helm into .tools/bin (go install) when missing

$(HELM_DOCS_STAMP):
	@command -v go >/dev/null 2>&1 || { echo "helm-docs is built with Go (go install github.com/norwoodj/helm-docs/cmd/helm-docs@$(HELM_DOCS_VERSION)): install Go" >&2; exit 1; }
	mkdir -p $(TOOLS)/bin
	GOBIN=$(TOOLS)/bin GOFLAGS=-buildvcs=false go install github.com/norwoodj/helm-docs/cmd/helm-docs@$(HELM_DOCS_VERSION)
	rm -f $(TOOLS)/bin/.helmdocs-*
	touch $@

.PHONY: helm-docs
helm-docs: $(HELM_DOCS_STAMP) ## Build the pinned helm-docs into .tools/bin (go install) when missing

.PHONY: chart-docs
chart-docs: helm-docs ## Write charts/notes-exports/README.md from README.md.gotmpl and the comments of values.yaml
	$(HELM_DOCS) $(HELM_DOCS_FLAGS)

.PHONY: chart-version-check
chart-version-check: ## Fail when the chart changed since the merge base with CHART_BASE_REF (main) without a version bump
	$(BIN)/python -m devtools.chartversion --chart $(CHART) --base $(CHART_BASE_REF)

$(NPM_TOOLS)/.installed: $(CRD_SCHEMAS)/package.json $(CRD_SCHEMAS)/package-lock.json
	@command -v npm >/dev/null 2>&1 || bash scripts/localstack.sh os-packages npm
	mkdir -p $(NPM_TOOLS)
	cp $(CRD_SCHEMAS)/package.json $(CRD_SCHEMAS)/package-lock.json $(NPM_TOOLS)/
	cd $(NPM_TOOLS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

.PHONY: schema-tools
schema-tools: $(NPM_TOOLS)/.installed promtool ## Install the published CRD schemas (npm) into .tools/npm

.PHONY: chart-tools
chart-tools: helm helm-docs schema-tools ## Everything the chart tests need (helm, helm-docs, CRD schemas, promtool)

.PHONY: chart-lint
chart-lint: helm ## helm lint --strict the chart with every ci/*-values.yaml
	@for f in $(CI_VALUES); do echo "== $$f"; \
	  $(HELM) lint $(CHART) --strict --kube-version $(KUBE_VERSION) -f $$f --set image.tag=$(IMAGE_TAG) || exit 1; done

.PHONY: chart-template
chart-template: helm ## Render the chart for every ci/*-values.yaml into .tools/rendered/
	@mkdir -p $(TOOLS)/rendered
	@for f in $(CI_VALUES); do out=$(TOOLS)/rendered/$$(basename $$f .yaml).yaml; \
	  $(HELM) template $(RELEASE) $(CHART) -n $(K8S_NAMESPACE) --kube-version $(KUBE_VERSION) -f $$f --set-string image.tag=$(IMAGE_TAG) >$$out || exit 1; \
	  echo "$$out: $$(grep -c '^kind:' $$out) objects"; done

.PHONY: test-chart
test-chart: install chart-tools os-packages ## Only the chart tests (render, schemas, policies, the chart's commands)
	HELM=$(HELM) $(BIN)/pytest -m chart $(PYTEST_ARGS)

.PHONY: image
image: ## Build the image $(IMAGE_REPO):$(IMAGE_TAG) (tag = git describe; docker, podman or buildah)
ifeq ($(CONTAINER_TOOL),buildah)
	$(MAKE) cluster-images IMAGE_TAG=$(IMAGE_TAG)
else
	$(CONTAINER_TOOL) build -t $(IMAGE) .
endif

.PHONY: pin-base-image
pin-base-image: ## Pin the Dockerfile's base image to the digest its tag has now (skopeo or docker buildx)
	bash scripts/pin-base-image.sh $(BASE_IMAGE)

.PHONY: kind-up
kind-up: ## Create the kind cluster (k8s/kind-config.yaml) with Envoy Gateway on localhost:8080
	@CONTAINER_TOOL=$(CONTAINER_TOOL) bash scripts/k8s-preflight.sh kind
	@$(MAKE) --no-print-directory helm
	kind get clusters 2>/dev/null | grep -qx $(KIND_CLUSTER) || kind create cluster --name $(KIND_CLUSTER) --config k8s/kind-config.yaml
	$(MAKE) gateway KUBE_CONTEXT=kind-$(KIND_CLUSTER)

.PHONY: gateway
gateway: helm ## Envoy Gateway (helm, with the Gateway API CRDs) and the Gateway of k8s/gateway.yaml
	$(HELM) upgrade --install eg oci://docker.io/envoyproxy/gateway-helm --version $(ENVOY_GATEWAY_VERSION) \
	  --kube-context $(KUBE_CONTEXT) -n envoy-gateway-system --create-namespace --wait --timeout 5m
	$(KUBECTL) apply -f k8s/gateway.yaml
	$(KUBECTL) -n envoy-gateway-system wait --for=condition=Programmed gateway/notes-exports --timeout=300s

.PHONY: kind-load
kind-load: image ## Build the image and load it into the kind cluster
	kind load docker-image $(IMAGE) --name $(KIND_CLUSTER)

.PHONY: dev-deps
dev-deps: ## Laptop PostgreSQL + Redis (k8s/dev-deps.yaml) and MinIO + its bucket (k8s/minio.yaml) in K8S_NAMESPACE
	$(KUBECTL) create namespace $(K8S_NAMESPACE) --dry-run=client -o yaml | $(KUBECTL) apply -f -
	$(KUBECTL) -n $(K8S_NAMESPACE) apply -f k8s/dev-deps.yaml
	$(KUBECTL) -n $(K8S_NAMESPACE) delete job minio-create-bucket --ignore-not-found
	$(KUBECTL) -n $(K8S_NAMESPACE) apply -f k8s/minio.yaml
	$(KUBECTL) -n $(K8S_NAMESPACE) rollout status statefulset/postgresql --timeout=300s
	$(KUBECTL) -n $(K8S_NAMESPACE) rollout status deploy/redis --timeout=300s
	$(KUBECTL) -n $(K8S_NAMESPACE) rollout status statefulset/minio --timeout=300s
	$(KUBECTL) -n $(K8S_NAMESPACE) wait --for=condition=complete job/minio-create-bucket --timeout=300s

.PHONY: minio-forward
minio-forward: ## Port-forward the dev MinIO to localhost:9000 (presigned downloads: k8s/values-redirect.yaml)
	$(KUBECTL) -n $(K8S_NAMESPACE) port-forward svc/minio 9000:9000

.PHONY: deploy
deploy: helm dev-deps ## helm upgrade --install the chart with IMAGE_TAG and DEPLOY_VALUES, then helm test
	$(HELM) upgrade --install $(RELEASE) $(CHART) --kube-context $(KUBE_CONTEXT) -n $(K8S_NAMESPACE) \
	  $(foreach f,$(DEPLOY_VALUES),-f $(f)) --set image.repository=$(IMAGE_REPO) --set-string image.tag=$(IMAGE_TAG) \
	  --wait --timeout 10m
	$(HELM) test $(RELEASE) --kube-context $(KUBE_CONTEXT) -n $(K8S_NAMESPACE) --logs

.PHONY: smoke
smoke: ## Zero to curl: tenant + key in the api pod, submit and download through the gateway
	bash k8s/smoke.sh $(INGRESS_URL) $(K8S_NAMESPACE) $(RELEASE) $(KUBE_CONTEXT)

.PHONY: undeploy
undeploy: helm ## Uninstall the release and the dev PostgreSQL/Redis/MinIO (the namespace stays)
	-$(HELM) uninstall $(RELEASE) --kube-context $(KUBE_CONTEXT) -n $(K8S_NAMESPACE) --wait
	-$(KUBECTL) -n $(K8S_NAMESPACE) delete -f k8s/minio.yaml --ignore-not-found
	-$(KUBECTL) -n $(K8S_NAMESPACE) delete -f k8s/dev-deps.yaml --ignore-not-found
	-$(KUBECTL) -n $(K8S_NAMESPACE) delete pvc -l 'app.kubernetes.io/name in (postgresql,minio)' --ignore-not-found

.PHONY: kind-down
kind-down: ## Delete the kind cluster
	kind delete cluster --name $(KIND_CLUSTER)

.PHONY: minikube-up
minikube-up: ## Start minikube (profile notes-exports) with Envoy Gateway on $$(minikube ip):30080
	@CONTAINER_TOOL=$(CONTAINER_TOOL) bash scripts/k8s-preflight.sh minikube
	@$(MAKE) --no-print-directory helm
	minikube start -p $(MINIKUBE_PROFILE) --cpus 4 --memory 6g
	$(MAKE) gateway KUBE_CONTEXT=$(MINIKUBE_PROFILE)

.PHONY: minikube-load
minikube-load: image ## Build the image and load it into minikube (minikube image load)
	minikube -p $(MINIKUBE_PROFILE) image load $(IMAGE)

.PHONY: minikube-deploy
minikube-deploy: ## deploy on minikube (values-kind.yaml + values-minikube.yaml)
	$(MAKE) deploy KUBE_CONTEXT=$(MINIKUBE_PROFILE) DEPLOY_VALUES="k8s/values-kind.yaml k8s/values-minikube.yaml"

.PHONY: minikube-smoke
minikube-smoke: ## smoke through the minikube gateway (http://$$(minikube ip):30080)
	$(MAKE) smoke KUBE_CONTEXT=$(MINIKUBE_PROFILE) INGRESS_URL=http://$$(minikube -p $(MINIKUBE_PROFILE) ip):30080

.PHONY: minikube-undeploy
minikube-undeploy: ## undeploy from minikube
	$(MAKE) undeploy KUBE_CONTEXT=$(MINIKUBE_PROFILE)

.PHONY: minikube-down
minikube-down: ## Delete the minikube profile
	minikube delete -p $(MINIKUBE_PROFILE)

# ---------------------------------------------------------------------------------------------
# Fault drills and chaos soak (devtools/drills). Both start their OWN PostgreSQL and Redis on
# free ports under .drills/ (never the test servers: drills stop, restart and flush them) and
# the seven Procfile processes; see docs/drills.md.
#   make drills [DRILLS="name ..."] [DRILLS_OUT=dir] [POOLER=1]   one JSON evidence file per drill
#                (POOLER=1: the processes behind PgBouncer in transaction mode, as make test runs them)
#   make soak [DURATION=600] [RATE=5] [SOAK_OUT=dir] [FAILOVERS=1]   chaos soak, report in soak.json
#                (FAILOVERS=1: on Patroni + Sentinel, a switchover or primary kill every 60 s)
# `make test` runs the CI subset of the drills and a two-minute soak (tests/drills, marker drills).
# ---------------------------------------------------------------------------------------------
DURATION   ?= 600
RATE       ?= 5
DRILLS     ?=
DRILLS_OUT ?=
SOAK_OUT   ?=
POOLER     ?=
FAILOVERS  ?=

.PHONY: drills
drills: install os-packages ## Run every fault drill on real processes, then the s3 ones on a local S3 (evidence: .drills/evidence/<time>/)
	$(BIN)/python -m devtools.drills run $(if $(DRILLS),--only $(DRILLS)) $(if $(DRILLS_OUT),--out $(DRILLS_OUT)) $(if $(filter 1,$(POOLER)),--pooler)
	$(BIN)/python -m devtools.drills run --s3 $(if $(DRILLS),--only $(DRILLS)) $(if $(DRILLS_OUT),--out $(DRILLS_OUT)/s3) $(if $(filter 1,$(POOLER)),--pooler)

.PHONY: drills-list
drills-list: install ## List the drills (ci = part of make test, s3 = also on an S3 store)
	$(BIN)/python -m devtools.drills list

.PHONY: soak
soak: install os-packages ## Chaos soak: DURATION s of random kills/stalls at RATE submits/s (.drills/soak/<time>/)
	$(BIN)/python -m devtools.drills soak --duration $(DURATION) --rate $(RATE) $(if $(SOAK_OUT),--out $(SOAK_OUT)) $(if $(filter 1,$(FAILOVERS)),--failovers)

.PHONY: drills-clean
drills-clean: ## Remove .drills/ (unmounts a storage tmpfs a killed run left behind)
	-for m in $$(awk '$$2 ~ "^$(CURDIR)/.drills/" {print $$2}' /proc/mounts); do umount -l "$$m"; done
	rm -rf .drills

# ---------------------------------------------------------------------------------------------
# The test cluster of this machine (devtools/cluster, docs/kubernetes.md): Kubernetes 1.34
# built from the Go module proxy, containerd + runc, a kubelet, kube-proxy and CoreDNS, pods on
# the bridge notesexp0 (no uplink). As root on Debian; binaries, images and buildah's layer
# cache under .tools/cluster, state and logs under .cluster (KUBECONFIG=.cluster/kubeconfig).
#   make cluster-up && make cluster-deploy && make cluster-smoke ... make cluster-down
# ---------------------------------------------------------------------------------------------
CLUSTER_PACKAGES := etcd-server etcd-client containerd runc containernetworking-plugins buildah \
                    debootstrap iptables conntrack socat openssl
CLUSTER          := $(BIN)/python -m devtools.cluster

.PHONY: cluster-packages
cluster-packages: ## Debian packages of the test cluster (etcd, containerd, runc, CNI plugins, buildah...)
	bash scripts/localstack.sh os-packages $(CLUSTER_PACKAGES)

.PHONY: cluster-build
cluster-build: install cluster-packages ## Build Kubernetes 1.34, crictl, pause, CoreDNS, Traefik, KEDA, Jaeger, prometheus-operator, Prometheus
	$(CLUSTER) build

.PHONY: cluster-images
cluster-images: cluster-build ## Build the images with buildah (debootstrap base as PYTHON_IMAGE, Debian PostgreSQL/Redis, moto)
	$(CLUSTER) images --tag $(IMAGE_TAG)

.PHONY: cluster-up
cluster-up: cluster-images ## Start the test cluster on this machine (root); KUBECONFIG=.cluster/kubeconfig
	$(CLUSTER) up

.PHONY: cluster-deploy
cluster-deploy: helm cluster-images ## The platform (Traefik, KEDA, Jaeger, Prometheus; CLUSTER_PLATFORM=0 leaves it out); PostgreSQL, Redis, S3 pods; helm install --wait, helm test
	HELM=$(HELM) $(CLUSTER) deploy --tag $(IMAGE_TAG)

.PHONY: cluster-smoke
cluster-smoke: ## k8s/smoke.sh through the Gateway (or the api Service with CLUSTER_PLATFORM=0): submit, status, presigned download, sha256
	$(CLUSTER) smoke

.PHONY: cluster-drills
cluster-drills: ## Pod, rollout, crictl kill, scale, KEDA, alert, SLO and dashboard drills (evidence: .cluster/evidence/)
	$(CLUSTER) drills

.PHONY: cluster-status
cluster-status: ## Components and node of the test cluster
	$(CLUSTER) status

.PHONY: cluster-down
cluster-down: ## Stop the test cluster; fails if any process, interface, route, rule or mount is left
	$(CLUSTER) down

.PHONY: test-cluster
test-cluster: install chart-tools cluster-packages ## The cluster tests (pytest -m cluster) with the platform around the pods (CLUSTER_PLATFORM=0: without); builds, starts, stops the cluster
	@# serial: one kubelet, one cluster (never -n)
	CLUSTER_TESTS=1 HELM=$(HELM) $(BIN)/pytest -n 0 -m cluster tests/cluster $(PYTEST_ARGS)

