package tracing

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// collector is an OTLP/gRPC trace receiver.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
	attrs map[string]string // resource attributes seen
}

func (c *collector) Export(_ context.Context, r *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			c.attrs[a.GetKey()] = a.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// picker answers every request-headers message with a destination, as the
// real picker does after scheduling.
type picker struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (picker) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if req.GetRequestHeaders() != nil {
			err = s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header: &corev3.HeaderValue{Key: eppwire.HeaderDestination, RawValue: []byte("10.0.0.7:8000")},
				}}}},
			}}})
			if err != nil {
				return err
			}
		}
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// A request through a traced ext_proc server reaches a real OTLP receiver
// as one span in the gateway's trace, with the chosen endpoint and the
// resource the chart's environment names.
func TestSpanPerRequestOverOTLP(t *testing.T) {
	col := &collector{attrs: map[string]string{}}
	colSrv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(colSrv, col)
	colLn := listen(t)
	go func() { _ = colSrv.Serve(colLn) }()
	defer colSrv.Stop()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+colLn.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_SERVICE_NAME", "llm-d-router/epp")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=epp-0")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0") // only the sampled parent's trace is kept
	ctx := context.Background()
	tr, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// WaitForHandlers: Stop returns once every handler, and the
	// interceptor around it that ends the span, has returned.
	srv := grpc.NewServer(grpc.StreamInterceptor(tr.StreamInterceptor()), grpc.WaitForHandlers(true))
	extprocv3.RegisterExternalProcessorServer(srv, picker{})
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	send := func(traceparent string) {
		stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hdrs := []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/completions")}, {Key: ":method", RawValue: []byte("POST")}}
		if traceparent != "" {
			hdrs = append(hdrs, &corev3.HeaderValue{Key: "traceparent", RawValue: []byte(traceparent)})
		}
		if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hdrs}},
		}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		_ = stream.CloseSend()
		if _, err := stream.Recv(); err != io.EOF {
			t.Fatalf("stream end: %v", err)
		}
	}
	send("00-" + traceID + "-00f067aa0ba902b7-01") // sampled by the gateway
	send("")                                       // a root: ratio 0 drops it
	// The client sees the stream end before the interceptor ends the span:
	// the spans are flushed once the server has stopped.
	srv.Stop()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.spans) != 1 {
		t.Fatalf("collector got %d spans, want 1 (the sampled request only)", len(col.spans))
	}
	s := col.spans[0]
	if got := hex.EncodeToString(s.GetTraceId()); got != traceID {
		t.Errorf("span trace = %s, want the gateway's %s", got, traceID)
	}
	if s.GetKind() != tracepb.Span_SPAN_KIND_SERVER || s.GetName() != "kvgate.epp.request" {
		t.Errorf("span = %s kind %v", s.GetName(), s.GetKind())
	}
	attrs := map[string]string{}
	for _, a := range s.GetAttributes() {
		attrs[a.GetKey()] = a.GetValue().GetStringValue()
	}
	if attrs["kvgate.endpoint"] != "10.0.0.7:8000" || attrs["url.path"] != "/v1/completions" {
		t.Errorf("span attributes = %v", attrs)
	}
	if col.attrs["service.name"] != "llm-d-router/epp" || col.attrs["k8s.pod.name"] != "epp-0" {
		t.Errorf("resource = %v", col.attrs)
	}
}
