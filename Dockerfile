# kvgate's images for users who build with Docker or BuildKit. `make images`
# builds the same images without a daemon (cmd/mkimage); both put the static
# binary on an empty base, run it as 65532:65532, and name the entrypoint
# the same way, so the Helm chart works with either.
#
#   docker build --target epp     -t ghcr.io/kvgate/kvgate-epp:0.1.0 .
#   docker build --target sim     -t ghcr.io/kvgate/kvgate-sim:0.1.0 .
#   docker build --target gateway -t ghcr.io/kvgate/kvgate-gateway:0.1.0 .
#   docker build --target filter  -t ghcr.io/kvgate/kvgate-filter:0.1.0 .

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/kvgate ./cmd/kvgate && \
    GOEXPERIMENT=jsonv2 GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o /out/kvgate-filter.wasm ./wasm-filter

# The Endpoint Picker. The GIE and llm-d charts pass only flags (no
# subcommand), so the entrypoint names it.
FROM scratch AS epp
COPY --from=build /out/kvgate /kvgate
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/kvgate", "epp"]

FROM scratch AS sim
COPY --from=build /out/kvgate /kvgate
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/kvgate", "sim"]

FROM scratch AS gateway
COPY --from=build /out/kvgate /kvgate
COPY --from=build /out/kvgate-filter.wasm /bin/kvgate-filter.wasm
WORKDIR /
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/kvgate", "gateway"]

# The proxy-wasm filter as an OCI artifact for Istio's WasmPlugin (oci://)
# and Envoy Gateway's EnvoyExtensionPolicy (type Image).
FROM scratch AS filter
COPY --from=build /out/kvgate-filter.wasm /plugin.wasm
