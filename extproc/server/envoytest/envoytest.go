// Package envoytest drives an ext_proc server over real gRPC the way Envoy
// does: message builders for each phase, a stream wrapper that fails the
// test on transport errors, and accessors for the responses the picker
// sends back. The server's own tests and the picker's integration tests
// share it.
package envoytest

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/inferr"
)

// StreamTimeout bounds every test stream, so that a server that stops
// answering fails the test instead of hanging it.
const StreamTimeout = 10 * time.Second

// Dial connects an ext_proc client to addr; the connection closes with the
// test.
func Dial(t testing.TB, addr string) extprocv3.ExternalProcessorClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// Stream is one ext_proc stream, i.e. one HTTP request as Envoy processes it.
type Stream struct {
	T      testing.TB
	Stream extprocv3.ExternalProcessor_ProcessClient
	Cancel context.CancelFunc
}

// Open starts a stream with a StreamTimeout deadline.
func Open(t testing.TB, c extprocv3.ExternalProcessorClient) *Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StreamTimeout)
	t.Cleanup(cancel)
	s, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &Stream{T: t, Stream: s, Cancel: cancel}
}

// Send sends m, failing the test on error.
func (s *Stream) Send(m *extprocv3.ProcessingRequest) {
	s.T.Helper()
	if err := s.Stream.Send(m); err != nil {
		s.T.Fatalf("send: %v", err)
	}
}

// Recv receives one response, failing the test on error.
func (s *Stream) Recv() *extprocv3.ProcessingResponse {
	s.T.Helper()
	r, err := s.Stream.Recv()
	if err != nil {
		s.T.Fatalf("recv: %v", err)
	}
	return r
}

// Headers builds a header map from name/value pairs, with raw_value set as
// current Envoy does.
func Headers(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// RequestHeaders is the request-headers message; eos marks a request
// without a body.
func RequestHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: Headers(kv...), EndOfStream: eos},
	}}
}

// RequestBody is one request-body chunk.
func RequestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos},
	}}
}

// ResponseHeaders is the response-headers message.
func ResponseHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: Headers(kv...), EndOfStream: eos},
	}}
}

// ResponseBody is one response-body chunk.
func ResponseBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos},
	}}
}

// RequestTrailers ends a request with trailers.
func RequestTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: Headers("grpc-status", "0")},
	}}
}

// ResponseTrailers ends a response with trailers.
func ResponseTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: Headers("x-t", "1")},
	}}
}

// WithModes attaches the protocol configuration Envoy sends on a stream's
// first message.
func WithModes(m *extprocv3.ProcessingRequest, req, resp procmode.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
	return m
}

// WithMetadata attaches filter metadata namespace → key → value.
func WithMetadata(m *extprocv3.ProcessingRequest, ns, key string, v *structpb.Value) *extprocv3.ProcessingRequest {
	if m.MetadataContext == nil {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	}
	s := m.MetadataContext.FilterMetadata[ns]
	if s == nil {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		m.MetadataContext.FilterMetadata[ns] = s
	}
	s.Fields[key] = v
	return m
}

// SetHeaders returns the header mutation of a request-headers response as a
// map, checking that every header overwrites rather than appends.
func SetHeaders(t testing.TB, r *extprocv3.ProcessingResponse) map[string]string {
	t.Helper()
	hr := r.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("want a request headers response, got %v", r)
	}
	out := map[string]string{}
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			t.Errorf("header %s appended instead of overwritten", h.GetHeader().GetKey())
		}
		out[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

// StreamedChunk returns the chunk of a FULL_DUPLEX_STREAMED body response.
func StreamedChunk(t testing.TB, b *extprocv3.BodyResponse) *extprocv3.StreamedBodyResponse {
	t.Helper()
	sr := b.GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		t.Fatalf("want a streamed body response, got %v", b)
	}
	return sr
}

// ImmediateError checks that r is an ImmediateResponse with status and a
// GIE error body of code, and returns it.
func ImmediateError(t testing.TB, r *extprocv3.ProcessingResponse, status int, code inferr.Code) *extprocv3.ImmediateResponse {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an immediate response, got %v", r)
	}
	if got := int(ir.GetStatus().GetCode()); got != status {
		t.Errorf("status = %d, want %d (body %q)", got, status, ir.GetBody())
	}
	if prefix := "inference error: " + string(code) + " - "; len(ir.GetBody()) < len(prefix) || string(ir.GetBody()[:len(prefix)]) != prefix {
		t.Errorf("body = %q, want prefix %q", ir.GetBody(), prefix)
	}
	return ir
}
