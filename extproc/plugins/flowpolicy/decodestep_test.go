package flowpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// loaded is an endpoint holding n in-flight requests of tokens tokens each
// (prompt plus expected output), as the director charges them.
func loaded(i, n int, tokens int64) *endpoints.Endpoint {
	e := ep(i, 0, 0, 0, 0, 0)
	for range n {
		e.Charge(0, tokens/4, tokens, tokens)
	}
	return e
}

func TestDecodeStepParams(t *testing.T) {
	tests := []struct {
		params string
		ok     bool
	}{
		{``, true},
		{`{"maxStep": "50ms", "stepOverhead": "0s", "perSequence": "10µs", "perContextToken": "40ns", "aggregate": "mean"}`, true},
		{`{"aggregate": "min"}`, true},
		{`{"aggregate": "max"}`, false},
		{`{"maxStep": "0s"}`, false},
		{`{"maxStep": "-1ms"}`, false},
		{`{"perSequence": "-1µs"}`, false},
		{`{"perContextToken": "ten"}`, false},
		{`{"stepOverhead": 0.005}`, true}, // a number is seconds
		{`{"stepOverhead": true}`, false},
		{`{"maxStepp": "10ms"}`, false},
	}
	for _, tt := range tests {
		var raw json.RawMessage
		if tt.params != "" {
			raw = json.RawMessage(tt.params)
		}
		_, err := NewDecodeStep("", raw, &scheduling.Handle{})
		if (err == nil) != tt.ok {
			t.Errorf("%s: err %v, want ok %v", tt.params, err, tt.ok)
		}
		// A refusal names the parameter (the one key of each bad case).
		if name, _, _ := strings.Cut(strings.TrimPrefix(tt.params, `{"`), `"`); err != nil &&
			!strings.Contains(err.Error(), "parameters."+name) && !strings.Contains(err.Error(), fmt.Sprintf("unknown field %q", name)) {
			t.Errorf("%s: %v does not name %s", tt.params, err, name)
		}
	}
}

func TestDecodeStepPrice(t *testing.T) {
	d := build(t, NewDecodeStep, `{"stepOverhead": "8ms", "perSequence": "16µs", "perContextToken": "46ns"}`, nil).(*DecodeStep)
	tests := []struct {
		n      int
		tokens int64
		want   time.Duration
	}{
		{0, 0, 8 * time.Millisecond},
		// 100 sequences of 800 tokens: 8 ms + 1.6 ms + 3.68 ms.
		{100, 800, 13280 * time.Microsecond},
		// The same 80,000 tokens in 40 sequences cost 0.96 ms less host time.
		{40, 2000, 12320 * time.Microsecond},
	}
	for _, tt := range tests {
		if got := d.Step(loaded(0, tt.n, tt.tokens)); (got - tt.want).Abs() > time.Microsecond {
			t.Errorf("%d × %d tokens: step %v, want %v", tt.n, tt.tokens, got, tt.want)
		}
	}
}

// TestDecodeStepLeavesOutRemotePrefills: a P/D prefill server computes
// prompts for other servers' decodes; they are in flight there but run no
// decode step on it, so its step stays the idle one however many it holds,
// while a collocated request of the same size lengthens it.
func TestDecodeStepLeavesOutRemotePrefills(t *testing.T) {
	d := build(t, NewDecodeStep, `{"stepOverhead": "8ms", "perSequence": "16µs", "perContextToken": "46ns"}`, nil).(*DecodeStep)
	prefill := loaded(0, 0, 0)
	at := time.Unix(100, 0)
	var remote []endpoints.Charge
	for range 20 {
		remote = append(remote, prefill.ChargeComputedBy(false, 0, 4000, 4000, 4000, at))
	}
	if got := d.Step(prefill); got != 8*time.Millisecond {
		t.Errorf("20 remote prefills: step %v, want the idle 8ms", got)
	}
	if n := prefill.InflightRequests(); n != 20 {
		t.Errorf("in flight %d, want the 20 remote prefills still counted there", n)
	}
	local := prefill.Charge(0, 4000, 4000, 4000)
	if got, want := d.Step(prefill), 8*time.Millisecond+16*time.Microsecond+4000*46*time.Nanosecond; (got - want).Abs() > time.Microsecond {
		t.Errorf("one collocated request beside them: step %v, want %v", got, want)
	}
	local.Release()
	for i := range remote {
		remote[i].Release()
	}
	if r, tok := prefill.DecodingInflight(); r != 0 || tok != 0 {
		t.Errorf("after release: decoding in flight %d requests, %d tokens", r, tok)
	}
}

func TestDecodeStepSaturation(t *testing.T) {
	step := func(n int) float64 { return 0.008 + 16e-6*float64(n) + 46e-9*1000*float64(n) }
	tests := []struct {
		aggregate string
		want      float64
	}{
		// The least loaded server sets the pool's saturation: a band held
		// below a ceiling dispatches while any server has room.
		{AggregateMin, step(10) / 0.1},
		{AggregateMean, (step(10) + step(200)) / 2 / 0.1},
	}
	for _, tt := range tests {
		light, heavy := loaded(0, 10, 1000), loaded(1, 200, 1000)
		d := build(t, NewDecodeStep, `{"maxStep": "100ms", "aggregate": "`+tt.aggregate+`"}`, nil).(*DecodeStep)
		if got := d.Saturation([]*endpoints.Endpoint{heavy, light}); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: saturation %v, want %v", tt.aggregate, got, tt.want)
		}
		if got := d.Saturation(nil); got != 1 {
			t.Errorf("%s: empty pool saturation %v, want 1", tt.aggregate, got)
		}
		// One more request of the pool's mean size (1,000 tokens) raises
		// the least loaded server's step by its credit; under mean the
		// pool's by a quarter of it.
		before := d.Saturation([]*endpoints.Endpoint{heavy, light})
		light.Charge(0, 250, 1000, 1000)
		after := d.Saturation([]*endpoints.Endpoint{heavy, light})
		credit := d.Credit([]*endpoints.Endpoint{heavy, light})
		if math.Abs((after-before)-credit) > 1e-9 {
			t.Errorf("%s: one request moved saturation by %v, credit %v", tt.aggregate, after-before, credit)
		}
	}
}

func TestDecodeStepScoresSheddableOnly(t *testing.T) {
	d := build(t, NewDecodeStep, ``, nil).(*DecodeStep)
	// Equal request counts, different context: the server whose step is
	// shorter scores best for a sheddable request.
	eps := []*endpoints.Endpoint{loaded(0, 50, 3000), loaded(1, 50, 800), loaded(2, 120, 800)}
	scores := []float64{-1, -1, -1}
	d.Score(context.Background(), scheduling.NewCycleState(), &scheduling.Request{Priority: -1}, eps, scores)
	if !(scores[1] == 1 && scores[0] == 0 && scores[2] > 0 && scores[2] < 1) {
		t.Fatalf("sheddable scores %v, want the 800-token server 1, the 3,000-token one 0, the 120-request one between", scores)
	}
	scores = []float64{-1, -1, -1}
	d.Score(context.Background(), scheduling.NewCycleState(), &scheduling.Request{Priority: 100}, eps, scores)
	for i, s := range scores {
		if s != -1 {
			t.Fatalf("protected request scored endpoint %d: %v", i, scores)
		}
	}
}
