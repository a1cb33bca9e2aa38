package predictedlatency_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/director"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatency"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
)

const lifecycleConfig = `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
- type: latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
`

// picker is the ext_proc server with the configured director over a
// one-endpoint pool, served on loopback, and the producer's model.
func picker(t *testing.T) (extprocClient func() *envoytest.Stream, model *latency.Model) {
	t.Helper()
	c, err := config.Parse([]byte(lifecycleConfig))
	if err != nil {
		t.Fatal(err)
	}
	built, err := config.Build(c, all.Registry(), &scheduling.Handle{Now: time.Now, Services: map[string]any{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range built.Plugins {
		if pr, ok := p.(*predictedlatency.Producer); ok {
			model = pr.Model()
		}
	}
	if model == nil {
		t.Fatal("no predicted-latency-producer built")
	}
	d := director.New(director.Options{Pool: schedtest.Pool{schedtest.Endpoint("a", endpoints.Metrics{})}, Scheduler: built.Scheduler,
		Hooks: director.Hooks{PreRequest: built.PreRequest, FirstToken: built.FirstToken, ResponseComplete: built.ResponseComplete, Hold: built.Hold}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	server.New(d, server.Options{}).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	client := envoytest.Dial(t, lis.Addr().String())
	return func() *envoytest.Stream { return envoytest.Open(t, client) }, model
}

// twinCounts is the producer's twin of the pool's endpoint: its queued
// prompts and its calendar's entries.
func twinCounts(m *latency.Model) (queued, decoding int) {
	for _, f := range m.Fits() {
		queued, decoding = queued+f.Queued, decoding+f.Decoding
	}
	return queued, decoding
}

// TestTwinReleasesEveryEnd: a routed request leaves the engine twin (its
// queue before its first token, the calendar of decoding sequences after
// it) however its stream ends: a client gone before or after the first
// token, an upstream error, or a completed response.
func TestTwinReleasesEveryEnd(t *testing.T) {
	const body = `{"model":"m","stream":true,"max_tokens":100,"prompt":"a prompt of a few words"}`
	const chunk = "data: {\"choices\":[{\"text\":\"x\"}]}\n\n"
	tests := []struct {
		name       string
		status     string
		firstToken bool
		wantQueued int // before the end
		wantDec    int
		end        func(e *envoytest.Stream)
	}{
		{"client gone before the first token", "200", false, 1, 0, func(e *envoytest.Stream) { e.Cancel() }},
		{"client gone mid-stream", "200", true, 0, 1, func(e *envoytest.Stream) { e.Cancel() }},
		{"upstream reset mid-stream", "200", true, 0, 1, func(e *envoytest.Stream) { _ = e.Stream.CloseSend() }},
		{"upstream error", "503", false, 1, 0, func(e *envoytest.Stream) {
			e.Send(envoytest.ResponseBody([]byte(`{"error":"overloaded"}`), true))
			e.Recv()
		}},
		{"completed", "200", true, 0, 1, func(e *envoytest.Stream) {
			e.Send(envoytest.ResponseBody([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n"), true))
			e.Recv()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			open, model := picker(t)
			e := open()
			e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions", "content-length", strconv.Itoa(len(body))))
			e.Send(envoytest.RequestBody([]byte(body), true))
			e.Recv()
			e.Recv()
			e.Send(envoytest.ResponseHeaders(false, ":status", tt.status, "content-type", "text/event-stream"))
			e.Recv()
			if tt.firstToken {
				e.Send(envoytest.ResponseBody([]byte(chunk), false))
				e.Recv()
			}
			if q, d := twinCounts(model); q != tt.wantQueued || d != tt.wantDec {
				t.Fatalf("twin holds %d queued, %d decoding before the end; want %d, %d", q, d, tt.wantQueued, tt.wantDec)
			}
			tt.end(e)
			// The server ends the exchange on its own goroutine once it
			// sees the stream end.
			deadline := time.Now().Add(envoytest.StreamTimeout)
			for {
				q, d := twinCounts(model)
				if q == 0 && d == 0 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("twin holds %d queued, %d decoding after the request ended", q, d)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}
