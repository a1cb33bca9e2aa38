package predictedlatency

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/plugins/inflightload"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
)

const prompt = 1000

var ctx = context.Background()

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// clock is a settable Handle.Now, so that the context TTL is tested without
// sleeping.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// recorder keeps every call it receives.
type recorder struct {
	mu        sync.Mutex
	predicted []string
	estimates []latency.Estimate
	ttft      []string
	tpot      []string
}

func (r *recorder) Predicted(id, model string, e latency.Estimate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.predicted = append(r.predicted, id+"/"+model)
	r.estimates = append(r.estimates, e)
}

func (r *recorder) ObservedTTFT(id, model string, predicted, actual time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ttft = append(r.ttft, fmt.Sprintf("%s/%s %v %v", id, model, predicted, actual))
}

func (r *recorder) ObservedTPOT(id, model string, predicted, actual time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tpot = append(r.tpot, fmt.Sprintf("%s/%s %v %v", id, model, predicted, actual))
}

type fixture struct {
	p     *Producer
	rec   *recorder
	clock *clock
}

func newFixture(t *testing.T, params string) *fixture {
	t.Helper()
	f := &fixture{rec: &recorder{}, clock: &clock{t: time.Unix(1_000_000, 0)}}
	h := &scheduling.Handle{Now: f.clock.now, Services: map[string]any{}}
	latency.WithRecorder(h.Services, f.rec)
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := New("", raw, h)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p.(*Producer)
	return f
}

func (f *fixture) produce(req *scheduling.Request, eps []*endpoints.Endpoint) (*scheduling.CycleState, *latency.Predictions) {
	cs := scheduling.NewCycleState()
	f.p.Produce(ctx, cs, req, eps)
	preds, _ := scheduling.Read(cs, latency.PredictionsKey)
	preds.FillTPOT() // as a reader of TPOT does
	return cs, preds
}

func routedTo(e *endpoints.Endpoint) *scheduling.Result {
	return &scheduling.Result{PrimaryProfile: "decode", Profiles: map[string]*scheduling.ProfileResult{
		"decode": {Targets: []*endpoints.Endpoint{e}},
	}}
}

// exchange is how the director drives one request through the producer:
// scheduled over eps, routed to target, first token and completion served
// by servedBy after ttft, with tpot between tokens.
type exchange struct {
	id       string
	stream   bool
	eps      []*endpoints.Endpoint
	target   *endpoints.Endpoint
	servedBy *endpoints.Endpoint // nil: the target
	ttft     time.Duration
	tpot     time.Duration
	wait     time.Duration // clock advance between the decision and the first token
	complete bool
	output   int // completion tokens in the response's usage
}

func (f *fixture) run(x exchange) {
	req := &scheduling.Request{ID: x.id, TargetModel: "m", PromptTokens: prompt, Stream: x.stream}
	cs, _ := f.produce(req, x.eps)
	f.p.PreRequest(ctx, cs, req, routedTo(x.target))
	served := x.servedBy
	if served == nil {
		served = x.target
	}
	if x.wait != 0 {
		f.clock.t = f.clock.t.Add(x.wait)
	}
	f.p.FirstToken(ctx, cs, req, &scheduling.Response{Endpoint: served, TTFT: x.ttft})
	f.p.ResponseComplete(ctx, cs, req, &scheduling.Response{Endpoint: served, TTFT: x.ttft, TPOT: x.tpot, Complete: x.complete,
		Usage: openai.Usage{CompletionTokens: x.output}})
}

// train serves n streamed, complete requests on each endpoint with its
// latencies, interleaved as a real pool would.
func (f *fixture) train(n int, eps []*endpoints.Endpoint, ttft, tpot []time.Duration) {
	for i := range n {
		for j, e := range eps {
			f.run(exchange{id: fmt.Sprint(i), stream: true, eps: eps, target: e, ttft: ttft[j], tpot: tpot[j], complete: true})
		}
	}
}

func pair() []*endpoints.Endpoint {
	return []*endpoints.Endpoint{schedtest.Endpoint("slow", endpoints.Metrics{}), schedtest.Endpoint("fast", endpoints.Metrics{})}
}

func TestProducePredictsEveryCandidate(t *testing.T) {
	f := newFixture(t, `{"sloBufferFactor": 1.3}`)
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{}), schedtest.Endpoint("c", endpoints.Metrics{})}
	_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if preds == nil {
		t.Fatal("no predictions in the cycle state")
	}
	if len(preds.Candidates) != 3 || &preds.Candidates[0] != &eps[0] || len(preds.Estimates) != 3 || len(preds.Features) != 3 || len(preds.Held) != 3 {
		t.Fatalf("predictions not over the candidates: %+v", preds)
	}
	for i, e := range preds.Estimates {
		// TPOT is unknown (0) until streams have ended: SLO checks skip it.
		if e.TTFT <= 0 || e.TPOT != 0 || e.TTFTQuantile < e.TTFT || e.TPOTQuantile != 0 {
			t.Errorf("%s: estimate %+v", eps[i].Name(), e)
		}
		if preds.Features[i].Prefill != prompt || preds.Held[i] != 0 {
			t.Errorf("%s: features %+v held %v without a prefix match", eps[i].Name(), preds.Features[i], preds.Held[i])
		}
	}
	if preds.BufferFactor != 1.3 {
		t.Errorf("buffer factor %v", preds.BufferFactor)
	}
}

func TestProduceUsesPrefixMatch(t *testing.T) {
	eps := []*endpoints.Endpoint{schedtest.Endpoint("holder", endpoints.Metrics{}), schedtest.Endpoint("half", endpoints.Metrics{}), schedtest.Endpoint("cold", endpoints.Metrics{})}
	tests := []struct {
		name string
		// over is the slice the prefix producer matched over, held its
		// 10-token blocks per endpoint of over.
		over func() []*endpoints.Endpoint
		held []float64
	}{
		{"same candidates", func() []*endpoints.Endpoint { return eps }, []float64{80, 50, 0}},
		// A match over another slice is looked up by endpoint.
		{"other order", func() []*endpoints.Endpoint { return []*endpoints.Endpoint{eps[2], eps[1], eps[0]} }, []float64{0, 50, 80}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "")
			cs := scheduling.NewCycleState()
			m := &prefixmatch.Prediction{BlockTokens: 10, PromptTokens: prompt}
			m.Reset(tc.over())
			for i, b := range tc.held {
				m.Matched(i, b)
			}
			scheduling.Write(cs, prefixmatch.MatchKey, m)
			f.p.Produce(ctx, cs, &scheduling.Request{PromptTokens: prompt}, eps)
			preds, _ := scheduling.Read(cs, latency.PredictionsKey)
			if got, want := preds.Held, []float64{0.8, 0.5, 0}; !slices.Equal(got, want) {
				t.Fatalf("held %v, want %v", got, want)
			}
			if got := []float64{preds.Features[0].Prefill, preds.Features[1].Prefill, preds.Features[2].Prefill}; !slices.Equal(got, []float64{200, 500, 1000}) {
				t.Fatalf("uncached prefill %v", got)
			}
			e := preds.Estimates
			if !(e[0].TTFT < e[1].TTFT && e[1].TTFT < e[2].TTFT) {
				t.Fatalf("more held should predict lower TTFT: %v %v %v", e[0].TTFT, e[1].TTFT, e[2].TTFT)
			}
		})
	}
}

func TestProduceFullyCachedStillComputesOneToken(t *testing.T) {
	f := newFixture(t, "")
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	cs := scheduling.NewCycleState()
	m := &prefixmatch.Prediction{BlockTokens: 10, PromptTokens: prompt}
	m.Reset(eps)
	m.Matched(0, 100)
	scheduling.Write(cs, prefixmatch.MatchKey, m)
	f.p.Produce(ctx, cs, &scheduling.Request{PromptTokens: prompt}, eps)
	preds, _ := scheduling.Read(cs, latency.PredictionsKey)
	if preds.Features[0].Prefill != 1 || preds.Held[0] != 1 {
		t.Fatalf("features %+v held %v", preds.Features[0], preds.Held[0])
	}
}

func TestProduceUsesLiveLoad(t *testing.T) {
	tests := []struct {
		name string
		load func(e *endpoints.Endpoint)
	}{
		{"charged prefill backlog", func(e *endpoints.Endpoint) { e.Charge(0, 5000, 5000, 5000) }},
		// Requests another picker routed are seen only as a queue length.
		{"external queue", func(e *endpoints.Endpoint) { e.SetMetrics(&endpoints.Metrics{WaitingQueueSize: 4}) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "")
			busy, idle := schedtest.Endpoint("busy", endpoints.Metrics{}), schedtest.Endpoint("idle", endpoints.Metrics{})
			tc.load(busy)
			_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, []*endpoints.Endpoint{busy, idle})
			if preds.Features[0].Backlog <= 0 || preds.Features[1].Backlog != 0 {
				t.Fatalf("backlogs %v, %v", preds.Features[0].Backlog, preds.Features[1].Backlog)
			}
			if b, i := preds.Estimates[0].TTFT, preds.Estimates[1].TTFT; b <= i {
				t.Fatalf("busy TTFT %v not above idle %v", b, i)
			}
		})
	}
}

// TestProduceUsesLoadSnapshot checks that the in-flight load snapshot, when
// produced over the same candidates, is what the prediction uses, so that
// every plugin of the request sees one set of numbers.
func TestProduceUsesLoadSnapshot(t *testing.T) {
	f := newFixture(t, "")
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	eps := []*endpoints.Endpoint{a, b}
	snap, err := schedtest.Build[*inflightload.Producer](inflightload.New, "")
	if err != nil {
		t.Fatal(err)
	}
	cs := scheduling.NewCycleState()
	snap.Produce(ctx, cs, &scheduling.Request{}, eps)
	a.Charge(0, 5000, 5000, 5000)
	f.p.Produce(ctx, cs, &scheduling.Request{PromptTokens: prompt}, eps)
	preds, _ := scheduling.Read(cs, latency.PredictionsKey)
	if preds.Features[0].Backlog != 0 || preds.Estimates[0] != preds.Estimates[1] {
		t.Fatalf("live load used over the snapshot: %+v", preds.Features[0])
	}
	if _, live := f.produce(&scheduling.Request{PromptTokens: prompt}, eps); live.Features[0].Backlog != 5000 {
		t.Fatalf("without a snapshot the backlog is %v", live.Features[0].Backlog)
	}
}

// TestExternalRequestsCountByMeanSize checks that a queued request the
// picker did not route weighs what the requests it routed weigh.
func TestExternalRequestsCountByMeanSize(t *testing.T) {
	f := newFixture(t, "")
	queued := schedtest.Endpoint("queued", endpoints.Metrics{WaitingQueueSize: 1})
	other := schedtest.Endpoint("other", endpoints.Metrics{})
	eps := []*endpoints.Endpoint{queued, other}
	_, before := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if got := before.Features[0].Backlog; got != 1000 {
		t.Fatalf("initial backlog of one external request %v, want the 1000-token prior", got)
	}
	for range 300 {
		req := &scheduling.Request{PromptTokens: 100}
		cs, _ := f.produce(req, eps)
		f.p.PreRequest(ctx, cs, req, routedTo(other))
	}
	_, after := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if got := after.Features[0].Backlog; got < 95 || got > 110 {
		t.Fatalf("after routing 100-token requests the external request weighs %v", got)
	}
}

func TestLearnsPerEndpoint(t *testing.T) {
	f := newFixture(t, `{"streamingMode": true}`)
	eps := pair()
	f.train(100, eps, []time.Duration{ms(400), ms(100)}, []time.Duration{ms(50), ms(10)})
	_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	slow, fast := preds.Estimates[0], preds.Estimates[1]
	if r := slow.TTFT.Seconds() / fast.TTFT.Seconds(); r < 3.5 || r > 4.5 {
		t.Errorf("TTFT %v vs %v: ratio %.2f, observed 4", slow.TTFT, fast.TTFT, r)
	}
	if d := slow.TTFT - ms(400); d < -ms(40) || d > ms(40) {
		t.Errorf("slow TTFT %v, observed 400ms", slow.TTFT)
	}
	if r := slow.TPOT.Seconds() / fast.TPOT.Seconds(); r < 4 || r > 6 {
		t.Errorf("TPOT %v vs %v: ratio %.2f, observed 5", slow.TPOT, fast.TPOT, r)
	}
	fits := f.p.Model().Fits()
	if len(fits) != 2 || fits[0].TTFTSamples != 100 || fits[1].TTFTSamples != 100 {
		t.Errorf("fits %+v", fits)
	}
}

// TestLearnsOutputLengths: complete responses teach each endpoint its mean
// output length (the twin frees a full batch's places by it); incomplete
// ones and responses from a fallback do not.
func TestLearnsOutputLengths(t *testing.T) {
	f := newFixture(t, `{"streamingMode": true}`)
	eps := pair()
	for i := range 10 {
		f.run(exchange{id: fmt.Sprint(i), stream: true, eps: eps, target: eps[0], ttft: ms(100), tpot: ms(10), complete: true, output: 300})
		f.run(exchange{id: fmt.Sprint(i), stream: true, eps: eps, target: eps[1], ttft: ms(100), tpot: ms(10), complete: true, output: 30})
		f.run(exchange{id: fmt.Sprint(i), stream: true, eps: eps, target: eps[1], ttft: ms(100), tpot: ms(10), output: 3000})
		f.run(exchange{id: fmt.Sprint(i), stream: true, eps: eps, target: eps[1], servedBy: eps[0], ttft: ms(100), tpot: ms(10), complete: true, output: 3000})
	}
	got := map[string]float64{}
	for _, ft := range f.p.Model().Fits() {
		got[ft.Address] = ft.MeanOutput
	}
	if got[eps[0].Address()] != 300 || got[eps[1].Address()] != 30 {
		t.Fatalf("mean output lengths %v, want 300 on %s and 30 on %s", got, eps[0].Address(), eps[1].Address())
	}
}

// TestLearnsTokensPerStepFromStreams: a completed stream teaches the
// tokens per step its endpoint's step clock counted from its first token,
// per sequence: a stream of n choices runs n sequences in the same steps
// (its usage sums them), and its output length per sequence too; a
// response sent whole does not teach the rate (its first chunk came at
// its end: the steps other streams ended while it was relayed are not its
// own).
func TestLearnsTokensPerStepFromStreams(t *testing.T) {
	tests := []struct {
		name       string
		stream     bool
		body       string // "": the headers-only path, no body
		tokens     int
		want       float64
		wantOutput float64
	}{
		{"streamed: 200 tokens after the first in 4 steps", true, "", 201, 50, 201},
		{"streamed, n=1", true, `{"model":"m","prompt":"p","n":1}`, 201, 50, 201},
		{"streamed, n=4: 4 sequences of 201 tokens", true, `{"model":"m","prompt":"p","n":4}`, 804, 50, 201},
		{"streamed, n out of range", true, `{"model":"m","prompt":"p","n":0}`, 201, 50, 201},
		{"sent whole", false, "", 201, 0, 201},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, "")
			eps := pair()
			e := eps[0]
			step := func() {
				f.clock.t = f.clock.t.Add(ms(10))
				e.ObserveStep(f.clock.t, 0)
			}
			step()
			req := &scheduling.Request{ID: "r", TargetModel: "m", PromptTokens: prompt, Stream: tt.stream, MaxTokens: 300}
			if tt.body != "" {
				body, err := openai.Parse(openai.Completions, []byte(tt.body))
				if err != nil {
					t.Fatal(err)
				}
				req.Body = body
			}
			cs, _ := f.produce(req, eps)
			f.p.PreRequest(ctx, cs, req, routedTo(e))
			req.Body = nil // as the director drops it after the decision
			f.p.FirstToken(ctx, cs, req, &scheduling.Response{Endpoint: e, TTFT: ms(10)})
			for range 4 {
				step()
			}
			f.p.ResponseComplete(ctx, cs, req, &scheduling.Response{Endpoint: e, TTFT: ms(10), Complete: true,
				Usage: openai.Usage{CompletionTokens: tt.tokens}})
			got, output := -1.0, -1.0
			for _, ft := range f.p.Model().Fits() {
				if ft.Address == e.Address() {
					got, output = ft.TokensPerStep, ft.MeanOutput
				}
			}
			if got != tt.want || output != tt.wantOutput {
				t.Fatalf("tokens per step %v, mean output %v; want %v, %v", got, output, tt.want, tt.wantOutput)
			}
		})
	}
}

func TestTPOTLearnedOnlyInStreamingMode(t *testing.T) {
	f := newFixture(t, "")
	eps := pair()
	f.train(100, eps, []time.Duration{ms(400), ms(100)}, []time.Duration{ms(50), ms(10)})
	_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if preds.Estimates[0].TTFT <= preds.Estimates[1].TTFT {
		t.Fatalf("TTFT not learned: %+v", preds.Estimates)
	}
	if preds.Estimates[0].TPOT != preds.Estimates[1].TPOT {
		t.Fatalf("TPOT learned outside streaming mode: %v vs %v", preds.Estimates[0].TPOT, preds.Estimates[1].TPOT)
	}
	// The TPOT pairs are still reported: the recorder measures the prior.
	if len(f.rec.tpot) != 200 {
		t.Fatalf("%d TPOT observations recorded, want 200", len(f.rec.tpot))
	}
}

// TestDoesNotLearn covers the responses whose latency says nothing about
// the prediction made: after them the model must predict as if new.
func TestDoesNotLearn(t *testing.T) {
	tests := []struct {
		name   string
		params string
		x      func(eps []*endpoints.Endpoint) exchange
	}{
		// A non-streamed response's first chunk is the whole response.
		{"not streamed", `{"streamingMode": true}`, func(eps []*endpoints.Endpoint) exchange {
			return exchange{eps: eps, target: eps[0], ttft: ms(900), tpot: ms(90), complete: true}
		}},
		{"served by a fallback", `{"streamingMode": true}`, func(eps []*endpoints.Endpoint) exchange {
			return exchange{stream: true, eps: eps, target: eps[0], servedBy: eps[1], ttft: ms(900), tpot: ms(90), complete: true}
		}},
		{"routed outside the candidates", `{"streamingMode": true}`, func(eps []*endpoints.Endpoint) exchange {
			stranger := schedtest.Endpoint("stranger", endpoints.Metrics{})
			return exchange{stream: true, eps: eps, target: stranger, ttft: ms(900), tpot: ms(90), complete: true}
		}},
		{"first token after contextTTL", `{"streamingMode": true, "contextTTL": "1s"}`, func(eps []*endpoints.Endpoint) exchange {
			return exchange{stream: true, eps: eps, target: eps[0], ttft: ms(900), tpot: ms(90), complete: true, wait: 2 * time.Second}
		}},
		// An integer is nanoseconds, as upstream's time.Duration field
		// reads it: 2000000000 is 2s, and 2 is 2ns.
		{"contextTTL in nanoseconds", `{"streamingMode": true, "contextTTL": 2000000000}`, func(eps []*endpoints.Endpoint) exchange {
			return exchange{stream: true, eps: eps, target: eps[0], ttft: ms(900), tpot: ms(90), complete: true, wait: 3 * time.Second}
		}},
		{"contextTTL of 2ns", `{"streamingMode": true, "contextTTL": 2}`, func(eps []*endpoints.Endpoint) exchange {
			return exchange{stream: true, eps: eps, target: eps[0], ttft: ms(900), tpot: ms(90), complete: true, wait: time.Millisecond}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.params)
			eps := pair()
			_, fresh := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
			want := slices.Clone(fresh.Estimates)
			for range 50 {
				f.run(tc.x(eps))
			}
			_, got := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
			if !slices.Equal(got.Estimates, want) {
				t.Fatalf("learned: %+v, untrained %+v", got.Estimates, want)
			}
			if len(f.rec.ttft) != 0 || len(f.rec.tpot) != 0 {
				t.Fatalf("observations recorded: %v %v", f.rec.ttft, f.rec.tpot)
			}
		})
	}
}

// TestLearnsWithinContextTTL is the counterpart of the TTL cases above,
// so that they fail for the TTL and not for some other reason.
func TestLearnsWithinContextTTL(t *testing.T) {
	for _, params := range []string{`{"contextTTL": "5m"}`, `{"contextTTL": 2000000000}`, `{"contextTTL": "1s"}`} {
		f := newFixture(t, params)
		eps := pair()
		_, fresh := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
		for range 50 {
			f.run(exchange{stream: true, eps: eps, target: eps[0], ttft: ms(900), complete: true, wait: ms(900)})
		}
		_, got := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
		if got.Estimates[0].TTFT <= fresh.Estimates[0].TTFT {
			t.Errorf("%s: not learned within the TTL: %v, untrained %v", params, got.Estimates[0].TTFT, fresh.Estimates[0].TTFT)
		}
	}
}

// TestConcurrentRequests runs requests of many goroutines through one
// producer, as the picker does; run with -race it checks that the shared
// model and the routed-size mean are safe to share.
func TestConcurrentRequests(t *testing.T) {
	f := newFixture(t, `{"streamingMode": true}`)
	eps := pair()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				target := eps[(g+i)%2]
				ttft := ms(100)
				if target == eps[0] {
					ttft = ms(400)
				}
				f.run(exchange{id: fmt.Sprint(g, "-", i), stream: true, eps: eps, target: target, ttft: ttft, tpot: ms(10), complete: true})
			}
		})
	}
	wg.Wait()
	if len(f.rec.ttft) != 400 || len(f.rec.predicted) != 400 {
		t.Fatalf("recorded %d predictions, %d TTFTs; want 400 each", len(f.rec.predicted), len(f.rec.ttft))
	}
	_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if r := preds.Estimates[0].TTFT.Seconds() / preds.Estimates[1].TTFT.Seconds(); r < 3.5 || r > 4.5 {
		t.Fatalf("TTFT ratio %.2f after concurrent training, observed 4", r)
	}
}

func TestIncompleteResponseTeachesNoTPOT(t *testing.T) {
	f := newFixture(t, `{"streamingMode": true}`)
	eps := pair()
	for range 50 {
		f.run(exchange{stream: true, eps: eps, target: eps[0], ttft: ms(100), tpot: ms(90)})
		f.run(exchange{stream: true, eps: eps, target: eps[1], ttft: ms(100), tpot: ms(10)})
	}
	_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if preds.Estimates[0].TPOT != preds.Estimates[1].TPOT || len(f.rec.tpot) != 0 {
		t.Fatalf("TPOT learned from incomplete streams: %+v, recorded %v", preds.Estimates, f.rec.tpot)
	}
	if len(f.rec.ttft) != 100 {
		t.Fatalf("%d TTFT observations, want 100: the first token came", len(f.rec.ttft))
	}
}

func TestRecorder(t *testing.T) {
	f := newFixture(t, "")
	eps := pair()
	req := &scheduling.Request{ID: "req-1", TargetModel: "llama", PromptTokens: prompt, Stream: true}
	cs, preds := f.produce(req, eps)
	// Copied now: the per-candidate predictions are the filters' and
	// scorers', not guaranteed past the decision.
	chosen := preds.Estimates[1]
	if len(f.rec.predicted) != 0 {
		t.Fatal("prediction recorded before the decision")
	}
	f.p.PreRequest(ctx, cs, req, routedTo(eps[1]))
	if !slices.Equal(f.rec.predicted, []string{"req-1/llama"}) || f.rec.estimates[0] != chosen {
		t.Fatalf("predicted %v %+v, want the chosen endpoint's %+v", f.rec.predicted, f.rec.estimates, chosen)
	}
	f.p.FirstToken(ctx, cs, req, &scheduling.Response{Endpoint: eps[1], TTFT: ms(250)})
	if want := fmt.Sprintf("req-1/llama %v %v", chosen.TTFT, ms(250)); !slices.Equal(f.rec.ttft, []string{want}) {
		t.Fatalf("observed TTFT %v, want %v", f.rec.ttft, want)
	}
	f.p.ResponseComplete(ctx, cs, req, &scheduling.Response{Endpoint: eps[1], TTFT: ms(250), TPOT: ms(15), Complete: true})
	if want := fmt.Sprintf("req-1/llama %v %v", chosen.TPOT, ms(15)); !slices.Equal(f.rec.tpot, []string{want}) {
		t.Fatalf("observed TPOT %v, want %v", f.rec.tpot, want)
	}
}

// TestOverlappingRequests checks that requests in flight together keep
// their own predictions: one request's decision, and the next request's
// predictions, must not change another's still being scheduled, nor what
// an earlier one learns from.
func TestOverlappingRequests(t *testing.T) {
	f := newFixture(t, "")
	eps := pair()
	reqA := &scheduling.Request{ID: "a", PromptTokens: prompt, Stream: true}
	reqB := &scheduling.Request{ID: "b", PromptTokens: 3 * prompt, Stream: true}
	csA, predsA := f.produce(reqA, eps)
	wantA := predsA.Estimates[0]
	csB, predsB := f.produce(reqB, eps)
	wantB := slices.Clone(predsB.Estimates)
	wantFeatB := slices.Clone(predsB.Features)

	f.p.PreRequest(ctx, csA, reqA, routedTo(eps[0]))
	eps[1].Charge(0, 50000, 50000, 50000)
	f.produce(&scheduling.Request{ID: "c", PromptTokens: 10}, eps)

	if got, ok := scheduling.Read(csB, latency.PredictionsKey); !ok || !slices.Equal(got.Estimates, wantB) || !slices.Equal(got.Features, wantFeatB) {
		t.Fatalf("b's predictions changed while it was being scheduled: %+v, want %+v", got, wantB)
	}
	f.p.PreRequest(ctx, csB, reqB, routedTo(eps[1]))
	if len(f.rec.estimates) != 2 || f.rec.estimates[0] != wantA || f.rec.estimates[1] != wantB[1] {
		t.Fatalf("recorded %+v, predicted a %+v and b %+v", f.rec.estimates, wantA, wantB[1])
	}
	f.p.FirstToken(ctx, csA, reqA, &scheduling.Response{Endpoint: eps[0], TTFT: ms(700)})
	if want := fmt.Sprintf("a/ %v %v", wantA.TTFT, ms(700)); !slices.Equal(f.rec.ttft, []string{want}) {
		t.Fatalf("observed TTFT %v, want %v", f.rec.ttft, want)
	}

	// a must have been learned from the features of its own decision: a
	// producer that saw a alone has learned exactly the same.
	g := newFixture(t, "")
	alone := pair()
	cs, _ := g.produce(reqA, alone)
	g.p.PreRequest(ctx, cs, reqA, routedTo(alone[0]))
	g.p.FirstToken(ctx, cs, reqA, &scheduling.Response{Endpoint: alone[0], TTFT: ms(700)})
	probe := pair()
	_, got := f.produce(reqA, probe)
	_, want := g.produce(reqA, probe)
	if got.Estimates[0] != want.Estimates[0] {
		t.Fatalf("a learned %+v with b and c in flight, %+v alone", got.Estimates[0], want.Estimates[0])
	}
}

func TestHooksWithoutState(t *testing.T) {
	f := newFixture(t, "")
	e := schedtest.Endpoint("a", endpoints.Metrics{})
	req := &scheduling.Request{ID: "x", Stream: true, PromptTokens: prompt}
	// Hooks of a request the producer never saw, or that picked nothing,
	// must neither panic nor record.
	cs := scheduling.NewCycleState()
	f.p.PreRequest(ctx, cs, req, routedTo(e))
	f.p.FirstToken(ctx, cs, req, &scheduling.Response{Endpoint: e, TTFT: ms(10)})
	f.p.ResponseComplete(ctx, cs, req, &scheduling.Response{Endpoint: e, TTFT: ms(10), TPOT: ms(1), Complete: true})
	cs, _ = f.produce(req, []*endpoints.Endpoint{e})
	f.p.PreRequest(ctx, cs, req, nil)
	f.p.PreRequest(ctx, cs, req, &scheduling.Result{PrimaryProfile: "decode", Profiles: map[string]*scheduling.ProfileResult{"decode": {}}})
	f.p.FirstToken(ctx, cs, req, &scheduling.Response{TTFT: ms(10)})
	f.p.FirstToken(ctx, cs, req, &scheduling.Response{Endpoint: e, TTFT: ms(10)})
	if len(f.rec.predicted)+len(f.rec.ttft)+len(f.rec.tpot) != 0 {
		t.Fatalf("recorded %v %v %v", f.rec.predicted, f.rec.ttft, f.rec.tpot)
	}
}

func TestEndpointsRemovedForgets(t *testing.T) {
	f := newFixture(t, "")
	eps := pair()
	f.train(50, eps, []time.Duration{ms(400), ms(100)}, []time.Duration{ms(50), ms(10)})
	newcomer := schedtest.Endpoint("newcomer", endpoints.Metrics{})
	withNew := []*endpoints.Endpoint{eps[0], eps[1], newcomer}
	_, before := f.produce(&scheduling.Request{PromptTokens: prompt}, withNew)
	if before.Estimates[0] == before.Estimates[2] {
		t.Fatal("slow endpoint predicts like a newcomer before being removed; the check below proves nothing")
	}
	f.p.EndpointsRemoved([]string{eps[0].Address()})
	_, after := f.produce(&scheduling.Request{PromptTokens: prompt}, withNew)
	// Forgotten, it falls back to the pool's fit like any newcomer; the
	// other endpoint keeps its own.
	if after.Estimates[0] != after.Estimates[2] {
		t.Fatalf("removed endpoint predicts %+v, a newcomer %+v", after.Estimates[0], after.Estimates[2])
	}
	if after.Estimates[1] != before.Estimates[1] {
		t.Fatalf("remaining endpoint changed: %+v, was %+v", after.Estimates[1], before.Estimates[1])
	}
	if fits := f.p.Model().Fits(); len(fits) != 1 || fits[0].Address != eps[1].Address() {
		t.Fatalf("fits after removal %+v", fits)
	}
}

func TestQuantile(t *testing.T) {
	// Alternating latencies leave a spread for the quantile to cover.
	observe := func(params string) latency.Estimate {
		f := newFixture(t, params)
		eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
		for i := range 600 {
			ttft := ms(100)
			if i%2 == 0 {
				ttft = ms(300)
			}
			f.run(exchange{stream: true, eps: eps, target: eps[0], ttft: ttft, complete: true})
		}
		_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
		return preds.Estimates[0]
	}
	lo, def, hi := observe(`{"quantile": 0.2}`), observe(""), observe(`{"quantile": 0.99}`)
	if !(lo.TTFTQuantile < def.TTFTQuantile && def.TTFTQuantile < hi.TTFTQuantile) {
		t.Fatalf("TTFT quantiles 0.2: %v, 0.9: %v, 0.99: %v", lo.TTFTQuantile, def.TTFTQuantile, hi.TTFTQuantile)
	}
	if def.TTFTQuantile <= def.TTFT {
		t.Fatalf("0.9 quantile %v not above the mean %v", def.TTFTQuantile, def.TTFT)
	}
}

func TestEndpointRoleLabel(t *testing.T) {
	prefill := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	decode := schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	unlabelled := schedtest.Endpoint("u", endpoints.Metrics{})
	eps := []*endpoints.Endpoint{prefill, decode, unlabelled}
	// The pool has seen streams end, so TPOT is known where it applies.
	trainTPOT := func(f *fixture) *fixture {
		for range latency.DefaultMinSamples {
			f.p.Model().ObserveTPOT("10.9.9.9:8000", latency.Features{Decodes: 1}, ms(10))
		}
		return f
	}
	f := trainTPOT(newFixture(t, fmt.Sprintf(`{"endpointRoleLabel": %q}`, endpoints.RoleLabel)))
	_, preds := f.produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if e := preds.Estimates[0]; e.TPOT != 0 || e.TPOTQuantile != 0 || e.TTFT <= 0 {
		t.Errorf("prefill endpoint predicts %+v", e)
	}
	for i := 1; i < 3; i++ {
		if e := preds.Estimates[i]; e.TPOT <= 0 {
			t.Errorf("%s predicts no TPOT: %+v", eps[i].Name(), e)
		}
	}
	// A prefill pod's TPOT is not a decode measurement.
	f.run(exchange{stream: true, eps: eps, target: prefill, ttft: ms(100), tpot: ms(10), complete: true})
	if len(f.rec.ttft) != 1 || len(f.rec.tpot) != 0 {
		t.Errorf("prefill endpoint recorded TTFT %v TPOT %v", f.rec.ttft, f.rec.tpot)
	}

	// Without the parameter the role means nothing.
	_, preds = trainTPOT(newFixture(t, "")).produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if preds.Estimates[0].TPOT <= 0 {
		t.Errorf("prefill endpoint predicts no TPOT without endpointRoleLabel")
	}
	// Another label key is not the role.
	_, preds = trainTPOT(newFixture(t, `{"endpointRoleLabel": "example.com/role"}`)).produce(&scheduling.Request{PromptTokens: prompt}, eps)
	if preds.Estimates[0].TPOT <= 0 {
		t.Errorf("prefill endpoint predicts no TPOT under another label key")
	}
}

func TestParams(t *testing.T) {
	for _, good := range []string{
		"", "{}",
		`{"samplingMean": 1000}`,
		`{"maxDecodeTokenSamplesForPrediction": 0}`,
		`{"predictInProduce": true}`,
		`{"useEncoderCacheFeatures": false, "encoderCacheMatchInfoProducerName": ""}`,
		`{"sloBufferFactor": 0.5}`,
		`{"quantile": 0.5}`,
		`{"contextTTL": "5m"}`,
		`{"contextTTL": 300000000000}`,
		`{"contextTTL": null}`,
		`{"streamingMode": true, "endpointRoleLabel": "llm-d.ai/role"}`,
	} {
		if _, err := schedtest.Build[*Producer](New, good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	for _, bad := range []string{
		`{"samplingMean": 500}`,
		`{"samplingMean": 0}`,
		`{"maxDecodeTokenSamplesForPrediction": 5}`,
		`{"predictInProduce": false}`,
		`{"useEncoderCacheFeatures": true}`,
		`{"encoderCacheMatchInfoProducerName": "encoder"}`,
		`{"sloBufferFactor": 0}`,
		`{"sloBufferFactor": -1}`,
		`{"quantile": 0}`,
		`{"quantile": 1}`,
		`{"quantile": 1.5}`,
		`{"quantile": -0.1}`,
		`{"contextTTL": "bogus"}`,
		`{"contextTTL": 0}`,
		`{"contextTTL": "-1s"}`,
		`{"contextTTL": true}`,
		`{"contextTTL": 1.5}`,
		`{"streamMode": true}`,
	} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestDependencies(t *testing.T) {
	p := newFixture(t, "").p
	if !slices.Equal(p.Produces(), []string{latency.PredictionsKey.String()}) {
		t.Errorf("produces %v", p.Produces())
	}
	for _, k := range []string{prefixmatch.MatchKey.String(), inflightload.Key.String()} {
		if !slices.Contains(p.Consumes(), k) {
			t.Errorf("consumes %v, missing %s", p.Consumes(), k)
		}
	}
	// Listed first, the producer must still run after the snapshot it
	// reads.
	snap, err := schedtest.Build[*inflightload.Producer](inflightload.New, "")
	if err != nil {
		t.Fatal(err)
	}
	order, err := scheduling.OrderProducers([]scheduling.DataProducer{p, snap})
	if err != nil {
		t.Fatal(err)
	}
	if order[0] != scheduling.DataProducer(snap) {
		t.Errorf("order %v", order)
	}
}
