package tracing

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// DefaultServiceName is the service.name when OTEL_SERVICE_NAME is unset.
const DefaultServiceName = "kvgate-epp"

// Tracer makes the picker's spans.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
}

// New starts an OTLP/gRPC exporter configured from the environment. The
// exporter connects lazily: an absent collector costs dropped spans, never
// a failed start.
func New(ctx context.Context, extra ...sdktrace.TracerProviderOption) (*Tracer, error) {
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("--tracing: OTLP exporter: %w", err)
	}
	return NewWithExporter(ctx, exp, extra...)
}

// NewWithExporter is New with a given exporter (tests, other transports).
func NewWithExporter(ctx context.Context, exp sdktrace.SpanExporter, extra ...sdktrace.TracerProviderOption) (*Tracer, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, fmt.Errorf("--tracing: resource: %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER / _ARG (default: parent
	// based, always on), as the SDK reads them.
	opts := append([]sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}, extra...)
	tp := sdktrace.NewTracerProvider(opts...)
	return &Tracer{
		provider: tp,
		tracer:   tp.Tracer("github.com/kvgate/kvgate/extproc"),
		prop:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// Shutdown flushes the spans still buffered.
func (t *Tracer) Shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }

// StreamInterceptor traces each ext_proc stream; other gRPC methods pass
// through.
func (t *Tracer) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, "/envoy.service.ext_proc.v3.ExternalProcessor/") {
			return handler(srv, ss)
		}
		ts := &tracedStream{ServerStream: ss, t: t}
		err := handler(srv, ts)
		ts.end(err)
		return err
	}
}

// tracedStream starts its span at the request headers (where the
// gateway's trace context arrives) and notes the endpoint the picker
// answers with. gRPC calls RecvMsg and SendMsg from the handler's
// goroutine, but end may race a late Send, hence the lock.
type tracedStream struct {
	grpc.ServerStream
	t *Tracer

	mu   sync.Mutex
	span trace.Span
}

func (s *tracedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err != nil {
		return err
	}
	req, ok := m.(*extprocv3.ProcessingRequest)
	if !ok {
		return nil
	}
	if h := req.GetRequestHeaders(); h != nil {
		s.mu.Lock()
		if s.span == nil {
			carrier := headerCarrier(h.GetHeaders().GetHeaders())
			ctx := s.t.prop.Extract(s.ServerStream.Context(), carrier)
			attrs := []attribute.KeyValue{}
			if p := carrier.Get(":path"); p != "" {
				attrs = append(attrs, attribute.String("url.path", p))
			}
			if m := carrier.Get(":method"); m != "" {
				attrs = append(attrs, attribute.String("http.request.method", m))
			}
			_, s.span = s.t.tracer.Start(ctx, "kvgate.epp.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		}
		s.mu.Unlock()
	}
	return nil
}

func (s *tracedStream) SendMsg(m any) error {
	if resp, ok := m.(*extprocv3.ProcessingResponse); ok {
		if ep := destination(resp); ep != "" {
			s.mu.Lock()
			if s.span != nil {
				s.span.SetAttributes(attribute.String("kvgate.endpoint", ep))
				s.span.AddEvent("endpoint picked")
			}
			s.mu.Unlock()
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			s.mu.Lock()
			if s.span != nil {
				s.span.SetAttributes(attribute.Int("http.response.status_code", int(ir.GetStatus().GetCode())))
			}
			s.mu.Unlock()
		}
	}
	return s.ServerStream.SendMsg(m)
}

func (s *tracedStream) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.span == nil {
		return
	}
	if err != nil && s.ServerStream.Context().Err() == nil {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

// destination is the x-gateway-destination-endpoint a response sets.
func destination(r *extprocv3.ProcessingResponse) string {
	var common *extprocv3.CommonResponse
	switch {
	case r.GetRequestHeaders() != nil:
		common = r.GetRequestHeaders().GetResponse()
	case r.GetRequestBody() != nil:
		common = r.GetRequestBody().GetResponse()
	default:
		return ""
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), eppwire.HeaderDestination) {
			return headerValue(h.GetHeader())
		}
	}
	return ""
}

func headerValue(h *corev3.HeaderValue) string {
	if v := h.GetRawValue(); len(v) > 0 {
		return string(v)
	}
	return h.GetValue()
}

// headerCarrier reads Envoy's request headers for the propagator.
type headerCarrier []*corev3.HeaderValue

func (c headerCarrier) Get(key string) string {
	for _, h := range c {
		if strings.EqualFold(h.GetKey(), key) {
			return headerValue(h)
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.GetKey()
	}
	return keys
}
