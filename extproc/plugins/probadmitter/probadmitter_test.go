package probadmitter

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func scraped(name string, queue int, kv float64) *endpoints.Endpoint {
	return schedtest.Endpoint(name, endpoints.Metrics{WaitingQueueSize: queue, KVCacheUsage: kv, UpdateTime: time.Unix(1, 0)})
}

func build(t *testing.T, params string, r scheduling.Rand) *Admitter {
	t.Helper()
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := New("", raw, &scheduling.Handle{Rand: r})
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Admitter)
}

func TestSaturationAndCurve(t *testing.T) {
	a := build(t, "", nil)
	tests := []struct {
		eps  []*endpoints.Endpoint
		want float64
	}{
		{nil, 0},
		{[]*endpoints.Endpoint{scraped("a", 0, 0)}, 0},
		// max of the two ratios per endpoint, then the mean.
		{[]*endpoints.Endpoint{scraped("a", 5, 0.2), scraped("b", 1, 0.4)}, (1 + 0.5) / 2},
		// Never scraped: fully saturated.
		{[]*endpoints.Endpoint{scraped("a", 0, 0), schedtest.Endpoint("b", endpoints.Metrics{})}, 0.5},
	}
	for i, tc := range tests {
		if got := a.MeanSaturation(tc.eps); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("case %d: saturation %v, want %v", i, got, tc.want)
		}
	}
	// llm-d's documented curve with power 5, k 300.
	for _, c := range []struct{ sat, p float64 }{{0.08, 0.0001}, {0.15, 0.023}, {0.2, 0.096}, {0.3, 0.729}, {0.34, 1}, {2, 1}} {
		if got := a.ShedProbability(c.sat); math.Abs(got-c.p) > 0.001 {
			t.Errorf("probability at %v: %v, want about %v", c.sat, got, c.p)
		}
	}
}

// fixed draws the same value every time.
type fixed float64

func (f fixed) Float64() float64 { return float64(f) }
func (f fixed) IntN(int) int     { return 0 }

func TestAdmit(t *testing.T) {
	ctx := context.Background()
	busy := []*endpoints.Endpoint{scraped("a", 1, 0.16), scraped("b", 1, 0.16)} // saturation 0.2: p ≈ 0.096
	tests := []struct {
		draw     float64
		priority int
		eps      []*endpoints.Endpoint
		admitted bool
	}{
		{draw: 0.05, priority: -1, eps: busy, admitted: false},
		{draw: 0.2, priority: -1, eps: busy, admitted: true},
		{draw: 0, priority: 0, eps: busy, admitted: true},
		{draw: 0, priority: 3, eps: busy, admitted: true},
		{draw: 0, priority: -1, eps: nil, admitted: true},
		// Idle pool: probability 0, and a draw of 0 is not below it.
		{draw: 0, priority: -1, eps: []*endpoints.Endpoint{scraped("a", 0, 0)}, admitted: true},
	}
	for i, tc := range tests {
		a := build(t, "", fixed(tc.draw))
		err := a.Admit(ctx, nil, &scheduling.Request{Priority: tc.priority}, tc.eps)
		if (err == nil) != tc.admitted || (err != nil && !errors.Is(err, ErrShed)) {
			t.Errorf("case %d: %v, admitted want %v", i, err, tc.admitted)
		}
	}
	if err := build(t, "", fixed(0)).Admit(ctx, nil, nil, busy); err != nil {
		t.Errorf("nil request refused: %v", err)
	}
}

// TestShedRate draws for real: the share shed converges on the curve, and
// parameters move it as llm-d documents (k=1000 sheds more at 0.2).
func TestShedRate(t *testing.T) {
	busy := []*endpoints.Endpoint{scraped("a", 1, 0.16), scraped("b", 1, 0.16)}
	for _, tc := range []struct {
		params string
		want   float64
	}{
		{"", math.Pow(0.2, 5) * 300},
		{`{"k": 1000}`, math.Pow(0.2, 5) * 1000},
		{`{"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.4, "power": 2, "k": 1}`, 0.16},
	} {
		a := build(t, tc.params, rand.New(rand.NewPCG(1, 2)))
		shed := 0
		const n = 20000
		for range n {
			if a.Admit(context.Background(), nil, &scheduling.Request{Priority: -1}, busy) != nil {
				shed++
			}
		}
		if got := float64(shed) / n; math.Abs(got-tc.want) > 0.015 {
			t.Errorf("%s: shed %.3f, want %.3f", tc.params, got, tc.want)
		}
	}
}

func TestParams(t *testing.T) {
	for _, bad := range []string{
		`{"queueDepthThreshold": 0}`, `{"kvCacheUtilThreshold": 0}`, `{"kvCacheUtilThreshold": -1}`,
		`{"power": 0}`, `{"k": -3}`, `{"threshold": 1}`, `{"power": "5"}`,
	} {
		if _, err := New("", []byte(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// The admitter is no saturation detector (llm-d accepts it as an admitter
// only), so the configuration cannot name it as one.
func TestNotASaturationDetector(t *testing.T) {
	var p scheduling.Plugin = build(t, "", nil)
	if _, ok := p.(flowcontrol.SaturationDetector); ok {
		t.Fatal("probabilistic-admitter implements flowcontrol.SaturationDetector")
	}
}
