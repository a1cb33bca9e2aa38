// Package tracing is --tracing: OpenTelemetry spans for the picker's
// requests, exported over OTLP/gRPC. The exporter, sampler and resource are
// configured by the standard OTEL_* environment variables the upstream
// charts set (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER[_ARG],
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). Each ext_proc stream (one
// HTTP request through the gateway) is one span, a child of the trace the
// gateway propagated in its traceparent header, carrying the endpoint the
// picker chose.
package tracing
