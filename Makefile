# celld-operator — build, check and test entry points.
#
#   make demo     local control plane + CRDs + sample fleets (README's first command)
#   make test     everything: checks, unit tests, real-cluster suites (README's second command)
#   make bench    journal benchmarks + operator benchmark on its own control plane (~2 h)
#
# Expensive builds (control-plane binaries, cargo-installed tools) are cached outside the
# checkout under $(CACHE), keyed by content hashes; a warm cache makes them no-ops.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CACHE ?= $(or $(CELLD_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/celld-operator)
export CELLD_CACHE_DIR := $(CACHE)
CARGO ?= cargo
CLUSTER_DIR ?= $(CURDIR)/.work/cluster
export CELLD_CLUSTER_DIR := $(CLUSTER_DIR)
KUBECTL = $(shell integration/cluster/build.sh 2>/dev/null | tail -n1)/kubectl --kubeconfig $(CLUSTER_DIR)/admin.kubeconfig

.PHONY: all deps build control-plane crds crds-check docs docs-check fmt-check clippy unit check test test-fast \
        chart-check store-tools test-bed test-cluster cluster-up cluster-down demo demo-down bench bench-journal bench-strict \
        bench-operator fuzz clean-cluster drills help

all: build

help:
	@grep -E '^#   make' Makefile | sed 's/^#   //'
	@echo "other targets: deps build control-plane crds check test-fast cluster-up cluster-down bench bench-journal bench-operator bench-strict fuzz"

## deps: Debian packages and toolchain pieces the build and tests need (idempotent).
deps:
	@echo "==> checking build dependencies"
	@missing=""; \
	for tool in openssl:openssl curl:curl setsid:util-linux flock:util-linux mount:mount promtool:prometheus strace:strace; do \
	  command -v $${tool%%:*} >/dev/null || missing="$$missing $${tool#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "==> apt-get install$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@command -v go >/dev/null || { echo "Go is required (the control plane is built from the Go module proxy)"; exit 1; }
	@command -v $(CARGO) >/dev/null || { echo "cargo is required"; exit 1; }
	@rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy
	@echo "==> dependencies ok ($$(go version | cut -d' ' -f3), $$($(CARGO) --version | cut -d' ' -f2))"

build: deps
	@echo "==> cargo build"
	$(CARGO) build --workspace --all-targets

## control-plane: builds kube-apiserver, controller-manager, scheduler, kubectl, etcd, helm (cached).
control-plane: deps
	@echo "==> control-plane binaries (cold build: ~10 min on 2 cores, once per machine)"
	integration/cluster/build.sh

crds:
	$(CARGO) run -q --bin celld-operator -- crds > crds/celld.eric.dev.yaml
	cp crds/celld.eric.dev.yaml helm/celld-operator/crds/celld.eric.dev.yaml
	@echo "==> crds/ and helm/celld-operator/crds/ regenerated"

docs:
	$(CARGO) run -q --bin celld-operator -- conditions > docs/conditions.md
	@echo "==> docs/conditions.md regenerated"

docs-check:
	@echo "==> checking docs/conditions.md for drift"
	@$(CARGO) run -q --bin celld-operator -- conditions | diff -u docs/conditions.md - \
	  || { echo "docs/conditions.md is stale: run 'make docs' and commit the result"; exit 1; }
	@echo "==> checking the docs' links and that nothing refers outside the repository"
	@python3 integration/check_docs.py

crds-check:
	@echo "==> checking crds/ for drift"
	@$(CARGO) run -q --bin celld-operator -- crds | diff -u crds/celld.eric.dev.yaml - \
	  || { echo "crds/ is stale: run 'make crds' and commit the result"; exit 1; }

fmt-check:
	@echo "==> rustfmt"
	$(CARGO) fmt --all -- --check

clippy:
	@echo "==> clippy (warnings denied)"
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## unit: tests that need no cluster (library, binary and journal tests).
unit:
	@echo "==> unit tests"
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test -p celld-journal

## chart-check: helm lint --strict, values-schema tests, template snapshots, chart CRD sync.
chart-check: control-plane
	helm/tests/chart-check.sh

check: deps fmt-check clippy unit crds-check docs-check chart-check

## store-tools: the test object store (s3s-fs 0.14.1, cargo-installed into the cache).
store-tools:
	@echo "==> s3s-fs (cached under $(CACHE)/tools)"
	integration/store/install-s3s.sh >/dev/null

## test-bed: simulator and store proxy against a real s3s-fs (no cluster needed).
test-bed: store-tools
	@echo "==> celld simulator and store proxy suites"
	$(CARGO) test -p celld-sim -p celld-store-proxy

## test-cluster: the real-cluster suites (starts or reuses the local control plane).
test-cluster: control-plane store-tools
	@echo "==> real-cluster suites (logs: $(CLUSTER_DIR)/logs)"
	$(CARGO) test -p celld-harness -- --test-threads=4
	$(CARGO) test -p celld-operator --test journal_cluster
	$(CARGO) test -p celld-test-kubelet
	$(CARGO) test -p celld-testbed
	$(CARGO) build -p celld-test-kubelet
	$(CARGO) test -p celld-operator --test operator_e2e -- --test-threads=4
	$(CARGO) test -p celld-operator --test journal_integrity -- --test-threads=3
	$(CARGO) test -p celld-operator --test operator_sim -- --test-threads=3
	$(CARGO) test -p celld-operator --test operator_strict -- --test-threads=4
	$(CARGO) test -p celld-operator --test operator_heal -- --test-threads=4
	$(CARGO) test -p celld-operator --test operator_faults -- --test-threads=3 --nocapture

test: check test-bed test-cluster
	@echo "==> all tests passed"

test-fast: deps
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test -p celld-harness --test crd_admission

cluster-up: control-plane
	integration/cluster/up.sh $(CLUSTER_DIR)

cluster-down:
	integration/cluster/down.sh $(CLUSTER_DIR)

clean-cluster:
	integration/cluster/down.sh $(CLUSTER_DIR) --purge

## demo: control plane, object store, test kubelet with simulator members, the operator,
## and the sample fleets; scales and restarts one and prints its journal.
demo: control-plane store-tools
	integration/demo.sh up

demo-down:
	integration/demo.sh down

## bench: journal benchmarks (criterion) and the operator benchmark (integration/bench/README.md).
bench: bench-journal bench-operator bench-strict

## bench-strict: wall time, runtime/Kubernetes/operator split and API writes of a Retire step and
## of coordinated restarts of 3 and 5 members (simulator members, real store; ~6 min).
bench-strict: control-plane store-tools
	@echo "==> strict operations benchmark (median of 3 each; progress on stderr)"
	$(CARGO) bench -p celld-operator --bench strict

## bench-journal: journal benchmarks (criterion; medians are reported in issue notes), then the
## mirror's memory and disk at 1,000 fleets as its history grows (journal/examples/mirror_memory.rs;
## docs/operations.md "Sizing the journal mirror"), with the operator's cache bound and sled's own.
bench-journal:
	@echo "==> journal benchmarks (criterion)"
	$(CARGO) bench -p celld-journal
	@echo "==> journal mirror memory and disk, 1,000 fleets x 100 operations (~2 min each)"
	$(CARGO) run --release -q -p celld-journal --example mirror_memory -- --fleets=1000 --operations=100 --every=20
	$(CARGO) run --release -q -p celld-journal --example mirror_memory -- --fleets=1000 --operations=100 --every=20 --cache-bytes=1073741824

## bench-operator: pod-ready → next effect latency and API requests per operation, then the
## scale bed (100/500/1,000 fleets of 3 members, cached vs fresh-read design: start-up, at-rest
## traffic, RSS, CPU, reaction under load, fairness) of the real operator binary, against its own
## control plane (.work/bench-cluster, ports from 17400: the dev cluster is left alone), the test
## kubelet and no-process members. Release builds: a debug operator's CPU time and RSS are not
## what ships. Prints a table and writes target/bench/operator.json. BENCH_ARGS passes options
## (e.g. BENCH_ARGS='--skip-ops --fleets 20,50 --at-rest-window 90s'; --help lists them).
BENCH_ARGS ?=
bench-operator: control-plane
	@echo "==> building celld-operator, celld-test-kubelet, celld-bench (release, fat LTO: about 15 minutes on 2 cores when cold)"
	$(CARGO) build --release -p celld-operator -p celld-test-kubelet -p celld-bench
	@echo "==> operator benchmark (~2 h with the defaults; progress on stderr)"
	$(CARGO) run --release -q -p celld-bench -- $(BENCH_ARGS)

## drills: the exhaustive fault drills (`--ignored` tests of tests/operator_faults.rs, then of
## tests/operator_strict.rs): every API fault kind on every write each Bucket operation kind
## sends and on every StatefulSet write and claim delete of the strict operations (one operator
## process per run, a table of operation x fault kind at the end), random-instant kills, and
## twelve leaders frozen at random instants; 66 min on 2 cores (2026-12-03: 788 sweep runs and
## 12 frozen leaders in 56 min, then 57 strict runs in 10 min). `make test` runs the bounded subsets.
drills: control-plane store-tools
	@echo "==> exhaustive fault drills, Bucket kinds and frozen leaders (tables on stderr)"
	$(CARGO) test -p celld-operator --test operator_faults -- --ignored --nocapture --test-threads=2
	@echo "==> exhaustive fault drills, strict operations with simulator members (table on stderr)"
	$(CARGO) test -p celld-operator --test operator_strict -- --ignored --nocapture

## fuzz: bounded fuzzing of the journal decoder and command parser.
FUZZ_SECONDS ?= 60
fuzz:
	journal/fuzz/run.sh $(FUZZ_SECONDS)
