package director

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/openai"
)

// releaseConfig is the live profile, whose plugins read the body (prefix
// hashes, prompt length), with the flow-control layer evicting sheddable
// requests: its in-flight items outlive their dispatch.
const releaseConfig = `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: ["flowControl"]
plugins:
- type: prefix-cache-scorer
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: latency-slo-admitter
- type: latency-scorer
- type: max-score-picker
- type: concurrency-detector
saturationDetector:
  pluginRef: concurrency-detector
flowControl:
  enableEviction: true
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
`

// bigRequest is a sheddable streaming request with a 1 MiB prompt, and
// weak pointers to its body and its parsed view. Nothing else refers to
// them: once the request drops them, only the director can keep them.
func bigRequest(t *testing.T) (*server.Request, weak.Pointer[byte], weak.Pointer[openai.Request]) {
	t.Helper()
	body := []byte(`{"model":"m","stream":true,"max_tokens":10,"prompt":"` + strings.Repeat("lorem ipsum ", 1<<20/12) + `"}`)
	parsed, err := openai.Parse(openai.Completions, body)
	if err != nil {
		t.Fatal(err)
	}
	req := &server.Request{ID: "r", Method: "POST", Path: "/v1/completions", API: openai.Completions,
		Headers: map[string]string{}, Body: body, Parsed: parsed, Objective: "batch", ReceivedAt: time.Now()}
	return req, weak.Make(&body[0]), weak.Make(parsed)
}

// TestExchangeDropsBody: a routed request's body is unreachable from its
// exchange while the response streams (the server has returned the body's
// budget share by then), with and without flow control, whose dispatch
// captured the request.
func TestExchangeDropsBody(t *testing.T) {
	for _, flow := range []bool{false, true} {
		name := "no flow control"
		if flow {
			name = "flow control with eviction"
		}
		t.Run(name, func(t *testing.T) {
			eps := pool{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
			opts, built := configuredOptions(t, releaseConfig, eps, time.Now)
			opts.Hooks.RequestHeader, opts.Hooks.ResponseHeader, opts.Hooks.ResponseMetadata = built.RequestHeader, built.ResponseHeader, built.ResponseMetadata
			opts.Objectives = objectives{"batch": -1}
			if flow {
				g, err := flowcontrol.NewGate(built.FlowControl.Config, flowcontrol.Options{Pool: eps}, time.Now)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { _ = g.Run(ctx); close(done) }()
				t.Cleanup(func() { cancel(); <-done })
				opts.Admission = g
			}
			d := New(opts)
			ctx := context.Background()
			req, body, parsed := bigRequest(t)
			dec, ex, err := d.HandleRequest(ctx, req)
			if err != nil || len(dec.Endpoints) == 0 {
				t.Fatalf("decision %v, %v", dec, err)
			}
			// As the server does once it has sent the body back.
			req.Body, req.Parsed = nil, nil
			ex.ResponseStarted(ctx, server.ResponseHead{Status: 200})
			ex.ResponseChunk(ctx, []byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"))
			runtime.GC()
			if body.Value() != nil {
				t.Error("the body is reachable while the response streams")
			}
			if parsed.Value() != nil {
				t.Error("the parsed body is reachable while the response streams")
			}
			ex.ResponseChunk(ctx, []byte("data: [DONE]\n\n"))
			ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Streaming: true, Complete: true})
		})
	}
}
