# kvgate build entry points. `make run` and `make test` work on a fresh
# machine by themselves: both depend on `setup`, which installs what is
# missing and is a no-op (a stamp check) when nothing changed.

SHELL      := /bin/bash
GO         ?= go
BIN        := bin
CACHE      := .cache
STAMP      := $(CACHE)/setup.stamp
GOFLAGS    ?=
# Debian packages the build and tests use (checked with dpkg, installed only
# when missing).
# prometheus: deploy/dashboards evaluates the dashboards' PromQL with it.
APT_PKGS   := nodejs npm prometheus
# libucx-dev, ucx-utils: nixl-cgo and the node agent (cgo over UCX), ucx_perftest.
APT_PKGS   += libucx-dev ucx-utils
# libzmq3-dev, gcc: the KV-event interop tests against the real libzmq.
APT_PKGS   += libzmq3-dev gcc
# redis-server: the batch and async Redis modes are tested against the real server.
APT_PKGS   += redis-server
# iproute2: agent/netobs's namespace tests (ip netns, veth, ss -ti).
APT_PKGS   += iproute2
# `make bpf` only (the bpf2go output is committed; builds need no clang).
BPF_PKGS   := clang llvm libbpf-dev linux-libc-dev
# Packages the wasm filter compiles in: they must keep building for wasip1.
WASM_PKGS  := ./internal/openai ./internal/hints ./internal/prefixhash ./internal/kvhash \
              ./internal/tokenizer/... ./internal/prompt
export KVGATE_TOKENIZER_DIR := $(CURDIR)/$(CACHE)/tokenizers/qwen3

.PHONY: all setup envtest build wasm images test test-short run bench bench-cluster bench-live bench-transfer chaos lint fmt proto bpf clean

all: build

$(STAMP): go.mod go.sum Makefile scripts/setup.sh scripts/setup-tokenizer.sh scripts/setup-openai-sdk.sh scripts/npm-pinned.sh
	@bash scripts/setup.sh $(APT_PKGS)
	@bash scripts/setup-tokenizer.sh
	@bash scripts/setup-openai-sdk.sh
	@mkdir -p $(CACHE) && touch $@

setup: $(STAMP)

# A real kube-apiserver (built from k8s.io/kubernetes), etcd, helm,
# kube-state-metrics (built from its module, for the autoscaling queries) and
# the third-party CRDs for the Kubernetes discovery and Helm chart tests, in
# .cache/envtest. The first run builds for several minutes; later runs
# return at once.
envtest:
	@bash scripts/envtest.sh

build: setup
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS) -o $(BIN)/kvgate ./cmd/kvgate
	$(GO) build $(GOFLAGS) -o $(BIN)/kvgate-agent ./cmd/kvgate-agent
	$(MAKE) --no-print-directory wasm

# jsonv2's decoder avoids encoding/json's per-byte indirect calls, which
# wasm pays dearly for: about 5x less filter time per request.
wasm:
	@mkdir -p $(BIN)
	GOEXPERIMENT=jsonv2 GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $(BIN)/kvgate-filter.wasm ./wasm-filter

# Container images without a Docker daemon (cmd/mkimage, go-containerregistry):
# the static binary (CGO_ENABLED=0) on an empty base, nothing pulled. One
# image per component, named as the Helm chart names them; the tarballs in
# bin/images/ load with `docker load`, `podman load`, `kind load
# image-archive`, or push with `crane push`. IMAGE_REGISTRY and
# IMAGE_VERSION override the names.
IMAGE_REGISTRY ?= ghcr.io/kvgate
IMAGE_VERSION  ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' deploy/helm/kvgate/Chart.yaml)
IMAGE_USER     := 65532:65532
IMAGE_LABELS   := --label org.opencontainers.image.source=https://github.com/kvgate/kvgate \
                  --label org.opencontainers.image.version=$(IMAGE_VERSION)
images: setup wasm
	@mkdir -p $(BIN)/static $(BIN)/images
	CGO_ENABLED=0 $(GO) build $(GOFLAGS) -trimpath -ldflags='-s -w' -o $(BIN)/static/kvgate ./cmd/kvgate
	$(GO) build $(GOFLAGS) -o $(BIN)/mkimage ./cmd/mkimage
	$(BIN)/mkimage --ref $(IMAGE_REGISTRY)/kvgate-epp:$(IMAGE_VERSION) --out $(BIN)/images/kvgate-epp.tar \
		--add $(BIN)/static/kvgate:/kvgate:0755 --entrypoint /kvgate,epp --user $(IMAGE_USER) \
		--port 9002 --port 9003 --port 9090 $(IMAGE_LABELS)
	$(BIN)/mkimage --ref $(IMAGE_REGISTRY)/kvgate-sim:$(IMAGE_VERSION) --out $(BIN)/images/kvgate-sim.tar \
		--add $(BIN)/static/kvgate:/kvgate:0755 --entrypoint /kvgate,sim --user $(IMAGE_USER) \
		--port 8000 $(IMAGE_LABELS)
	$(BIN)/mkimage --ref $(IMAGE_REGISTRY)/kvgate-gateway:$(IMAGE_VERSION) --out $(BIN)/images/kvgate-gateway.tar \
		--add $(BIN)/static/kvgate:/kvgate:0755 --add $(BIN)/kvgate-filter.wasm:/bin/kvgate-filter.wasm \
		--workdir / --entrypoint /kvgate,gateway --user $(IMAGE_USER) --port 8080 $(IMAGE_LABELS)
	$(BIN)/mkimage --ref $(IMAGE_REGISTRY)/kvgate-filter:$(IMAGE_VERSION) --out $(BIN)/images/kvgate-filter.tar \
		--add $(BIN)/kvgate-filter.wasm:/plugin.wasm $(IMAGE_LABELS)

# The whole suite, race detector on. The KVGATE_REQUIRE_* variables turn
# "skip when an asset is missing" (tokenizer files and node, the envtest
# binaries, gcc and libzmq, prometheus) into failures: after setup they must be there. KVGATE_BIN_DIR
# lets the end-to-end tests use the binaries just built.
test: build envtest images
	KVGATE_REQUIRE_TOKENIZER=1 KVGATE_REQUIRE_ENVTEST=1 KVGATE_REQUIRE_LIBZMQ=1 KVGATE_REQUIRE_PROMETHEUS=1 KVGATE_REQUIRE_REDIS=1 KVGATE_REQUIRE_OPENAI_SDK=1 KVGATE_BIN_DIR=$(CURDIR)/$(BIN) $(GO) test -race -timeout 20m ./...

test-short: setup
	$(GO) test -short ./...

run: build
	$(BIN)/kvgate up

# Micro-benchmarks; figures are recorded in benchmarks/RESULTS.md.
bench: setup
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s ./... | tee $(CACHE)/bench.txt

# The cluster simulations of benchmarks/RESULTS.md.
bench-cluster: build
	$(BIN)/kvgate bench --trace ../shared/traces/mooncake_synthetic_trace.jsonl --replicas 8 \
		--preset llama-3.1-8b-h100 --qps-scale 3 --seed 1 --out benchmarks/results/mooncake
	$(BIN)/kvgate bench --workload shared-prefix --replicas 8 --preset qwen3-32b-tp2-h100 --groups 150 \
		--prefix-tokens 6000 --suffix-tokens 1200 --output-tokens 300 --ramp 3,10,20,30,40,50,60 \
		--stage-duration 30s --seed 1 --out benchmarks/results/llmd
	$(MAKE) --no-print-directory bench-live

# The live-load-model runs of benchmarks/RESULTS.md: bursty arrivals, a mixed
# H100/H200 fleet, SLO attainment.
TRACE    := ../shared/traces/mooncake_synthetic_trace.jsonl
ALL_POLS := random,round-robin,load,approx,precise,oracle
bench-live: build
	$(BIN)/kvgate bench --trace $(TRACE) --replicas 8 --preset llama-3.1-8b-h100 --sweep 1,2,3 \
		--arrival-quantum 1s --seed 1 --policies $(ALL_POLS) --out benchmarks/results/live-trace-bursty
	$(BIN)/kvgate bench --workload chat --burst 6 --replicas 8 --preset llama-3.1-8b-h100 --sweep 4,16,32 \
		--seed 1 --policies $(ALL_POLS) --out benchmarks/results/live-chat-bursty
	$(BIN)/kvgate bench --trace $(TRACE) --replicas 8 --preset llama-3.1-8b-h100 --sweep 1,2,3 \
		--seed 1 --policies $(ALL_POLS) --out benchmarks/results/live-trace-poisson
	$(BIN)/kvgate bench --trace $(TRACE) --presets llama-3.1-8b-h100:4,llama-3.1-8b-h200:4 --sweep 2,3 \
		--arrival-quantum 1s --seed 1 --policies round-robin,approx,precise,oracle --out benchmarks/results/live-mixed-fleet
	$(BIN)/kvgate bench --trace $(TRACE) --replicas 8 --preset llama-3.1-8b-h100 --sweep 2,3 --arrival-quantum 1s \
		--seed 1 --slo-ttft 2s --slo-fraction 0.3 --policies round-robin,load,approx,precise --out benchmarks/results/live-slo

# nixl-cgo's 64 MiB READ/WRITE against ucx_perftest's ucp_get/ucp_put_bw, same
# run, same transport (UCX_TLS, default tcp on lo).
bench-transfer: setup
	@bash scripts/bench-transfer.sh
# Hostile clients, killed and stopped processes and a soak against a real
# fleet from the built binary (a few minutes; not in `make test`). Prints
# one HELD/BROKE line per check; the last run is in benchmarks/RESULTS.md.
# KVGATE_BIN=<older kvgate> measures another build the same way.
CHAOS_SOAK ?= 60s
chaos: build
	KVGATE_CHAOS=1 KVGATE_CHAOS_SOAK=$(CHAOS_SOAK) KVGATE_BIN=$${KVGATE_BIN:-$(CURDIR)/$(BIN)/kvgate} \
		KVGATE_WASM=$(CURDIR)/$(BIN)/kvgate-filter.wasm KVGATE_CHAOS_OUT=$(CURDIR)/$(CACHE)/chaos.txt \
		$(GO) test -count=1 -v -timeout 20m -run TestChaos ./benchmarks/chaos

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) build -o /dev/null $(WASM_PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# Regenerates the Go code of kvgate's own gRPC APIs from proto/.
proto:
	@bash scripts/proto.sh

# Regenerates agent/netobs's eBPF object and its Go loader (bpf2go, pinned
# in go.mod as a tool) from netobs.bpf.c.
bpf:
	@bash scripts/setup.sh $(BPF_PKGS)
	BPF_INCLUDE=/usr/include/$$(gcc -print-multiarch) $(GO) generate ./agent/netobs

clean:
	rm -rf $(BIN) $(CACHE)/setup.stamp
