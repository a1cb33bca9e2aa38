package latencyslo

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// ep describes one candidate's state as the admitter sees it.
type ep struct {
	kv   float64
	idle bool // otherwise one routed request is charged to it
	est  latency.Estimate
}

var (
	// Quantiles against a 1s TTFT SLO.
	meets  = latency.Estimate{TTFT: ms(500), TTFTQuantile: ms(800), TPOT: ms(20), TPOTQuantile: ms(30)}
	misses = latency.Estimate{TTFT: ms(1500), TTFTQuantile: ms(2500), TPOT: ms(20), TPOTQuantile: ms(30)}
)

func TestAdmit(t *testing.T) {
	sheddable := scheduling.Request{Priority: -1, TTFTSLO: time.Second}
	tests := []struct {
		name   string
		req    scheduling.Request
		eps    []ep
		noPred bool
		buffer float64
		refuse bool
	}{
		{"sheddable, none meets", sheddable, []ep{{kv: 0.5, est: misses}, {kv: 0.5, est: misses}}, false, 0, true},
		{"sheddable, one meets", sheddable, []ep{{kv: 0.5, est: misses}, {kv: 0.5, est: meets}}, false, 0, false},
		{"not sheddable", scheduling.Request{Priority: 0, TTFTSLO: time.Second}, []ep{{kv: 0.5, est: misses}}, false, 0, false},
		{"critical", scheduling.Request{Priority: 5, TTFTSLO: time.Second}, []ep{{kv: 0.5, est: misses}}, false, 0, false},
		{"no SLO", scheduling.Request{Priority: -1}, []ep{{kv: 0.5, est: misses}}, false, 0, false},
		{"no predictions", sheddable, []ep{{kv: 0.5, est: misses}}, true, 0, false},
		// The prediction rests on the least evidence where nothing runs
		// or the cache is nearly empty.
		{"an idle endpoint", sheddable, []ep{{kv: 0.5, est: misses}, {kv: 0.5, idle: true, est: misses}}, false, 0, false},
		{"a cold endpoint", sheddable, []ep{{kv: 0.5, est: misses}, {kv: 0.01, est: misses}}, false, 0, false},
		{"cold ends at 2%", sheddable, []ep{{kv: 0.02, est: misses}}, false, 0, true},
		// ok's TPOT quantile (30ms) misses a 25ms TPOT SLO.
		{"tpot miss", scheduling.Request{Priority: -1, TTFTSLO: time.Second, TPOTSLO: ms(25)}, []ep{{kv: 0.5, est: meets}}, false, 0, true},
		{"tpot meets", scheduling.Request{Priority: -1, TPOTSLO: ms(40)}, []ep{{kv: 0.5, est: misses}}, false, 0, false},
		// 800ms times 1.5 is over the 1s SLO.
		{"buffer factor", sheddable, []ep{{kv: 0.5, est: meets}}, false, 1.5, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := make([]*endpoints.Endpoint, len(tc.eps))
			p := &latency.Predictions{BufferFactor: tc.buffer}
			for i, e := range tc.eps {
				eps[i] = schedtest.Endpoint(string(rune('a'+i)), endpoints.Metrics{KVCacheUsage: e.kv})
				if !e.idle {
					eps[i].Charge(0, 100, 200, 200)
				}
			}
			p.Reset(eps)
			for i, e := range tc.eps {
				p.Estimates[i] = e.est
			}
			cs := scheduling.NewCycleState()
			if !tc.noPred {
				scheduling.Write(cs, latency.PredictionsKey, p)
			}
			err := build(t).Admit(context.Background(), cs, &tc.req, eps)
			switch {
			case tc.refuse && !errors.Is(err, ErrSLOUnattainable):
				t.Fatalf("admitted (err %v), want ErrSLOUnattainable", err)
			case !tc.refuse && err != nil:
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

// TestLiveLoadIsAnyRequest checks that every kind of request the live load
// knows of makes an endpoint busy, and that a released one does not.
func TestLiveLoadIsAnyRequest(t *testing.T) {
	req := &scheduling.Request{Priority: -1, TTFTSLO: time.Second}
	tests := []struct {
		name   string
		load   func(e *endpoints.Endpoint)
		refuse bool
	}{
		{"prefill", func(e *endpoints.Endpoint) { e.Charge(0, 100, 100, 100) }, true},
		{"decode", func(e *endpoints.Endpoint) { c := e.Charge(0, 100, 100, 100); c.FirstToken() }, true},
		{"released", func(e *endpoints.Endpoint) { c := e.Charge(0, 100, 100, 100); c.Release() }, false},
		{"moved away", func(e *endpoints.Endpoint) {
			c := e.Charge(0, 100, 100, 100)
			c.Move(schedtest.Endpoint("elsewhere", endpoints.Metrics{}))
		}, false},
		// Requests the picker did not route, known from the scrape.
		{"external waiting", func(e *endpoints.Endpoint) { e.SetMetrics(&endpoints.Metrics{KVCacheUsage: 0.5, WaitingQueueSize: 2}) }, true},
		{"external running", func(e *endpoints.Endpoint) { e.SetMetrics(&endpoints.Metrics{KVCacheUsage: 0.5, RunningRequests: 1}) }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := schedtest.Endpoint("e", endpoints.Metrics{KVCacheUsage: 0.5})
			tc.load(e)
			eps := []*endpoints.Endpoint{e}
			p := &latency.Predictions{}
			p.Reset(eps)
			p.Estimates[0] = misses
			cs := scheduling.NewCycleState()
			scheduling.Write(cs, latency.PredictionsKey, p)
			err := build(t).Admit(context.Background(), cs, req, eps)
			if tc.refuse != (err != nil) {
				t.Fatalf("err %v, want refusal %v", err, tc.refuse)
			}
		})
	}
}

// TestAdmitFilteredSubset checks that only the candidates handed over
// count: a meeting endpoint the predictions cover but the request may not
// use does not admit it.
func TestAdmitFilteredSubset(t *testing.T) {
	all := make([]*endpoints.Endpoint, 3)
	for i := range all {
		all[i] = schedtest.Endpoint(string(rune('a'+i)), endpoints.Metrics{KVCacheUsage: 0.5})
		all[i].Charge(0, 100, 100, 100)
	}
	p := &latency.Predictions{}
	p.Reset(all)
	p.Estimates[0], p.Estimates[1], p.Estimates[2] = meets, misses, misses
	cs := scheduling.NewCycleState()
	scheduling.Write(cs, latency.PredictionsKey, p)
	req := &scheduling.Request{Priority: -1, TTFTSLO: time.Second}
	a := build(t)
	if err := a.Admit(context.Background(), cs, req, all[1:]); !errors.Is(err, ErrSLOUnattainable) {
		t.Errorf("subset without the meeting endpoint: err %v", err)
	}
	if err := a.Admit(context.Background(), cs, req, []*endpoints.Endpoint{all[0], all[2]}); err != nil {
		t.Errorf("subset with the meeting endpoint: %v", err)
	}
}

func build(t *testing.T) *Admitter {
	t.Helper()
	a, err := schedtest.Build[*Admitter](New, "")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestParams(t *testing.T) {
	for _, good := range []string{"", "{}", "null"} {
		if _, err := schedtest.Build[*Admitter](New, good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	if _, err := New("", []byte(`{"threshold": 1}`), &scheduling.Handle{}); err == nil {
		t.Error("a parameter accepted")
	}
	a := build(t)
	if !slices.Contains(a.Consumes(), latency.PredictionsKey.String()) || len(a.Produces()) != 0 {
		t.Errorf("consumes %v, produces %v", a.Consumes(), a.Produces())
	}
}
