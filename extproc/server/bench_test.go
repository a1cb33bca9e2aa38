package server

import (
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
)

// trivialDirector routes everything to one endpoint and ignores responses:
// the benchmark measures the protocol handler, not scheduling.
type trivialDirector struct{}

func (trivialDirector) HandleRequest(context.Context, *Request) (*Decision, Exchange, error) {
	return &Decision{Endpoints: []string{"10.0.0.1:8000"}}, trivialDirector{}, nil
}
func (trivialDirector) ResponseStarted(context.Context, ResponseHead) {}
func (trivialDirector) ResponseChunk(context.Context, []byte)         {}
func (trivialDirector) ResponseDone(context.Context, ResponseSummary) {}

// BenchmarkRoundTrip drives complete requests over loopback gRPC the way
// Envoy does: request headers and, on the compatible path, a small chat body
// (FULL_DUPLEX_STREAMED, answered with the decision and the re-sent body) or,
// on the fast path, headers only (body mode NONE); then a JSON response with
// usage, and the stream's close. One op is one routed request.
func BenchmarkRoundTrip(b *testing.B) {
	hdr := func(eos bool) *extprocv3.ProcessingRequest {
		return envoytest.RequestHeaders(eos, ":method", "POST", ":path", "/v1/chat/completions", "x-request-id", "bench",
			"content-type", "application/json", "content-length", strconv.Itoa(len(chatBody)))
	}
	b.Run("body", func(b *testing.B) {
		benchRoundTrip(b, []*extprocv3.ProcessingRequest{hdr(false), envoytest.RequestBody([]byte(chatBody), true)}, 2)
	})
	b.Run("headers-only", func(b *testing.B) {
		fast := envoytest.WithModes(hdr(false), procmode.ProcessingMode_NONE, procmode.ProcessingMode_FULL_DUPLEX_STREAMED)
		benchRoundTrip(b, []*extprocv3.ProcessingRequest{fast}, 1)
	})
}

func benchRoundTrip(b *testing.B, request []*extprocv3.ProcessingRequest, replies int) {
	c := startServer(b, New(trivialDirector{}, Options{}))
	rhdr := envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json")
	rbody := envoytest.ResponseBody([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":1}}`), true)
	ctx := context.Background()

	b.ReportAllocs()
	b.SetParallelism(4) // Envoy keeps many streams in flight per connection
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s, err := c.Process(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := roundTrip(s, request, replies); err != nil {
				b.Error(err)
				return
			}
			if err := roundTrip(s, []*extprocv3.ProcessingRequest{rhdr, rbody}, 2); err != nil {
				b.Error(err)
				return
			}
			if err := s.CloseSend(); err != nil {
				b.Error(err)
				return
			}
			if _, err := s.Recv(); err != io.EOF {
				b.Errorf("stream end: %v", err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}

func roundTrip(s extprocv3.ExternalProcessor_ProcessClient, msgs []*extprocv3.ProcessingRequest, replies int) error {
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	for range replies {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkHandler is the handler's own cost per request, without gRPC: the
// same message sequence as BenchmarkRoundTrip played into Process directly.
func BenchmarkHandler(b *testing.B) {
	s := New(trivialDirector{}, Options{})
	msgs := []*extprocv3.ProcessingRequest{
		envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions", "x-request-id", "bench",
			"content-type", "application/json", "content-length", strconv.Itoa(len(chatBody))),
		envoytest.RequestBody([]byte(chatBody), true),
		envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"),
		envoytest.ResponseBody([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":1}}`), true),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		st := &scriptedStream{ctx: ctx, cancel: cancel, msgs: msgs, cancelAt: -1}
		if err := s.Process(st); err != nil {
			b.Fatal(err)
		}
	}
}
