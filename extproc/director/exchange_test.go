package director

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/metrics"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
)

// liveDirector routes with kvgate's precise-style live profile, minus the
// KV index: the approximate prefix scorer as the prefix producer.
func liveDirector(t *testing.T, eps pool, now func() time.Time) *Director {
	t.Helper()
	return configuredDirector(t, `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: latency-slo-admitter
- type: latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
`, eps, now)
}

// configuredDirector routes eps with the EndpointPickerConfig yaml, its
// request, first-token, response and hold hooks in place.
func configuredDirector(t *testing.T, yaml string, eps pool, now func() time.Time) *Director {
	t.Helper()
	opts, _ := configuredOptions(t, yaml, eps, now)
	return New(opts)
}

// configuredOptions are configuredDirector's options, and the configuration
// built, for tests that add to them.
func configuredOptions(t *testing.T, yaml string, eps pool, now func() time.Time) (Options, *config.Built) {
	t.Helper()
	built := buildConfig(t, yaml, &scheduling.Handle{Now: now, Services: map[string]any{}})
	return Options{Pool: eps, Scheduler: built.Scheduler, Now: now,
		Hooks: Hooks{PreRequest: built.PreRequest, FirstToken: built.FirstToken, ResponseComplete: built.ResponseComplete, Hold: built.Hold}}, built
}

func completion(prompt string, stream bool) *server.Request {
	return &server.Request{ID: "r", API: openai.Completions, Headers: map[string]string{},
		Parsed: &openai.Request{API: openai.Completions, Model: "m", Prompt: prompt, Stream: stream, MaxTokens: 10}, ReceivedAt: time.Now()}
}

// The live load follows a request through its exchange: prefill backlog at
// the decision, decode load from the first chunk, moved when the proxy
// served a fallback, released at the end.
func TestExchangeChargesLiveLoad(t *testing.T) {
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	d := liveDirector(t, pool{a, b}, time.Now)
	ctx := context.Background()
	dec, ex, err := d.HandleRequest(ctx, completion("a prompt long enough to be several prefix blocks of text, surely", true))
	if err != nil {
		t.Fatal(err)
	}
	primary := pool{a, b}.ByAddress(dec.Endpoints[0])
	other := a
	if primary == a {
		other = b
	}
	if l := primary.Load(); l.PrefillRequests != 1 || l.PrefillTokens <= 0 || primary.InflightRequests() != 1 {
		t.Fatalf("after the decision: %+v", l)
	}
	ex.ResponseStarted(ctx, server.ResponseHead{Status: 200, ServedEndpoint: other.Address()})
	if primary.InflightRequests() != 0 || other.Load().PrefillRequests != 1 {
		t.Fatalf("fallback: primary %+v, other %+v", primary.Load(), other.Load())
	}
	ex.ResponseChunk(ctx, []byte("data: {}\n\n"))
	if l := other.Load(); l.PrefillRequests != 0 || l.DecodeRequests != 1 || l.DecodeTokens <= 0 {
		t.Fatalf("after the first chunk: %+v", l)
	}
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true, ServedEndpoint: other.Address()})
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true}) // once only
	for _, e := range []*endpoints.Endpoint{a, b} {
		if l := e.Load(); l != (endpoints.Load{}) || e.InflightRequests() != 0 || e.InflightTokens() != 0 {
			t.Fatalf("%s after the end: %+v, in flight %d", e.Name(), l, e.InflightRequests())
		}
	}
}

// A burst of identical requests spreads over idle endpoints: each decision
// sees the backlog the previous ones charged, with no scrape in between.
// The prompts are long enough (some 3,000 tokens) that two in one step
// cost more than one: a few dozen tokens each would share one
// memory-bound step at no cost, and the latency model rightly packs them.
func TestBurstSpreadsOnLiveLoad(t *testing.T) {
	eps := pool{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{}),
		schedtest.Endpoint("c", endpoints.Metrics{}), schedtest.Endpoint("d", endpoints.Metrics{})}
	d := liveDirector(t, eps, time.Now)
	per := map[string]int{}
	for i := range 8 {
		req := completion("unrelated prompt number "+strconv.Itoa(i)+strings.Repeat(" with enough words to weigh something in tokens", 250), true)
		dec, _, err := d.HandleRequest(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		per[dec.Endpoints[0]]++
	}
	for _, e := range eps {
		if per[e.Address()] != 2 {
			t.Fatalf("burst of 8 over 4 idle endpoints landed %v", per)
		}
	}
}

func TestSLOHeaders(t *testing.T) {
	tests := []struct {
		name       string
		headers    map[string]string
		ttft, tpot time.Duration
	}{
		{name: "none"},
		{name: "current", headers: map[string]string{eppwire.HeaderSLOTTFT: "500", eppwire.HeaderSLOTPOT: "40"}, ttft: 500 * time.Millisecond, tpot: 40 * time.Millisecond},
		{name: "deprecated", headers: map[string]string{eppwire.HeaderSLOTTFTDeprecated: "250", eppwire.HeaderSLOTPOTDeprecated: "20"}, ttft: 250 * time.Millisecond, tpot: 20 * time.Millisecond},
		{name: "current wins", headers: map[string]string{eppwire.HeaderSLOTTFT: "100", eppwire.HeaderSLOTTFTDeprecated: "900"}, ttft: 100 * time.Millisecond},
		{name: "fractional", headers: map[string]string{eppwire.HeaderSLOTTFT: " 12.5 "}, ttft: 12500 * time.Microsecond},
		{name: "malformed", headers: map[string]string{eppwire.HeaderSLOTTFT: "soon", eppwire.HeaderSLOTPOT: "-3"}},
		{name: "zero and NaN", headers: map[string]string{eppwire.HeaderSLOTTFT: "0", eppwire.HeaderSLOTPOT: "NaN"}},
		{name: "absurd", headers: map[string]string{eppwire.HeaderSLOTTFT: "1e300"}, ttft: maxSLO},
	}
	d := New(Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := completion("p", false)
			for k, v := range tt.headers {
				req.Headers[k] = v
			}
			sr := d.schedulingRequest(req)
			if sr.TTFTSLO != tt.ttft || sr.TPOTSLO != tt.tpot {
				t.Errorf("SLO = %v / %v, want %v / %v", sr.TTFTSLO, sr.TPOTSLO, tt.ttft, tt.tpot)
			}
		})
	}
}

// A sheddable request with an SLO no endpoint can meet is refused with 429
// by the latency admitter; the same request without the SLO is routed.
func TestAdmitterRefusalIs429(t *testing.T) {
	eps := pool{schedtest.Endpoint("a", endpoints.Metrics{KVCacheUsage: 0.5}), schedtest.Endpoint("b", endpoints.Metrics{KVCacheUsage: 0.5})}
	for _, e := range eps {
		e.Charge(0, 50_000, 50_000, 50_000) // busy: a long prefill ahead of anything new
	}
	d := liveDirector(t, eps, time.Now)
	d.opts.Objectives = objectives{"batch": -1}
	req := completion("p", true)
	req.Objective = "batch"
	req.Headers[eppwire.HeaderSLOTTFT] = "1"
	_, _, err := d.HandleRequest(context.Background(), req)
	var ie *inferr.Error
	if !errors.As(err, &ie) || ie.Code != inferr.ResourceExhausted || ie.DroppedReason != eppwire.DroppedSaturated {
		t.Fatalf("err = %v, want a 429 rejected-saturated refusal", err)
	}
	delete(req.Headers, eppwire.HeaderSLOTTFT)
	if _, _, err := d.HandleRequest(context.Background(), req); err != nil {
		t.Fatalf("without an SLO: %v", err)
	}
}

// streamAdmitter admits a request while its stream lasts, as a plugin
// that waits on something with the request's context fails once it ends.
type streamAdmitter struct{ scheduling.Named }

func (streamAdmitter) Admit(ctx context.Context, _ *scheduling.CycleState, _ *scheduling.Request, _ []*endpoints.Endpoint) error {
	return ctx.Err()
}

// A stream that ends while its request is scheduled is a cancellation:
// the server ends the stream rather than answer the gone client 500, and
// no Internal error is counted.
func TestCancelledWhileScheduling(t *testing.T) {
	r := all.Registry()
	if err := r.Register("stream-admitter", func(name string, _ json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
		return streamAdmitter{scheduling.NewNamed("stream-admitter", name)}, nil
	}); err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse([]byte("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: stream-admitter\n- type: random-picker\n"))
	if err != nil {
		t.Fatal(err)
	}
	built, err := config.Build(c, r, &scheduling.Handle{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	d := New(Options{Pool: pool{schedtest.Endpoint("a", endpoints.Metrics{})}, Scheduler: built.Scheduler, Metrics: metrics.New(reg)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, ex, err := d.HandleRequest(ctx, completion("p", true))
	if !errors.Is(err, context.Canceled) || ex != nil {
		t.Fatalf("HandleRequest = %v, %v; want context.Canceled and no exchange", ex, err)
	}
	if n, err := testutil.GatherAndCount(reg, "llm_d_epp_request_error_total"); err != nil || n != 0 {
		t.Fatalf("%d request error series for a cancelled request (%v), want none", n, err)
	}
}

type objectives map[string]int

func (o objectives) Priority(name string) (int, bool) { p, ok := o[name]; return p, ok }

type rewrites map[string]string

func (r rewrites) RewriteModel(model string) (string, string, bool) {
	t, ok := r[model]
	return t, "rw", ok
}

// An InferenceModelRewrite retargets the request (the body's model is
// replaced upstream); the x-llm-d-model-name-rewrite header wins over it.
func TestModelRewrites(t *testing.T) {
	eps := pool{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	d := liveDirector(t, eps, time.Now)
	d.opts.Rewrites = rewrites{"m": "m-v2"}
	req := completion("p", false)
	dec, ex, err := d.HandleRequest(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	ex.ResponseDone(context.Background(), server.ResponseSummary{})
	if dec.TargetModel != "m-v2" {
		t.Fatalf("target model %q, want the rewrite's m-v2", dec.TargetModel)
	}
	req.ModelRewrite = "m-canary"
	if sr := d.schedulingRequest(req); sr.TargetModel != "m-canary" || sr.IncomingModel != "m" {
		t.Fatalf("target %q incoming %q: the header must win", sr.TargetModel, sr.IncomingModel)
	}
	req.ModelRewrite = ""
	req.Parsed.Model = "other"
	if sr := d.schedulingRequest(req); sr.TargetModel != "other" {
		t.Fatalf("unmatched model rewritten to %q", sr.TargetModel)
	}
}
