#!/usr/bin/env bash
# Regenerates the Go code of kvgate's own gRPC APIs: every proto/**/*.proto
# gets its .pb.go and _grpc.pb.go beside it. protoc comes from Debian
# (protobuf-compiler, installed when missing); the Go plugins are the `tool`
# entries of go.mod (protoc-gen-go, protoc-gen-go-grpc), built at the
# versions go.mod pins.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mapfile -t protos < <(find proto -name '*.proto' 2>/dev/null | sort)
if ((${#protos[@]} == 0)); then
	echo "proto: no .proto files under proto/; nothing to generate"
	exit 0
fi
if ! command -v protoc >/dev/null; then
	SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq protobuf-compiler >/dev/null
fi
gobin="$root/.cache/bin"
mkdir -p "$gobin"
go build -o "$gobin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$gobin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
PATH="$gobin:$PATH" protoc -I proto \
	--go_out=proto --go_opt=paths=source_relative \
	--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	"${protos[@]}"
echo "proto: generated ${#protos[@]} file(s)"
