package picker

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func scored(scores ...float64) []scheduling.ScoredEndpoint {
	out := make([]scheduling.ScoredEndpoint, len(scores))
	for i, s := range scores {
		out[i] = scheduling.ScoredEndpoint{Endpoint: schedtest.Endpoint(string(rune('a'+i)), endpoints.Metrics{}), Score: s}
	}
	return out
}

func build(t *testing.T, f scheduling.Factory, params string) scheduling.Picker {
	t.Helper()
	h := &scheduling.Handle{Rand: rand.New(rand.NewPCG(1, 2))}
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := f("", raw, h)
	if err != nil {
		t.Fatal(err)
	}
	return p.(scheduling.Picker)
}

func names(r *scheduling.ProfileResult) string {
	s := ""
	for _, e := range r.Targets {
		s += e.Name()
	}
	return s
}

func TestMaxScore(t *testing.T) {
	tests := []struct {
		params string
		scores []float64
		want   string
	}{
		{"", []float64{0.1, 0.9, 0.5}, "b"},
		{`{"maxNumOfEndpoints": 3}`, []float64{0.1, 0.9, 0.5, 0.7}, "bdc"},
		{`{"maxNumOfEndpoints": 10}`, []float64{0.2, 0.1}, "ab"},
	}
	for _, tc := range tests {
		p := build(t, NewMaxScore, tc.params)
		if got := names(p.Pick(context.Background(), nil, nil, scored(tc.scores...))); got != tc.want {
			t.Errorf("%s %v: got %q want %q", tc.params, tc.scores, got, tc.want)
		}
	}
}

// Ties must be broken at random, otherwise equal endpoints would not share
// load.
func TestMaxScoreTieBreakIsRandom(t *testing.T) {
	for _, params := range []string{"", `{"maxNumOfEndpoints": 2}`} {
		p := build(t, NewMaxScore, params)
		seen := map[string]int{}
		for range 300 {
			r := p.Pick(context.Background(), nil, nil, scored(1, 0.2, 1, 1))
			seen[r.Targets[0].Name()]++
			if r.Targets[0].Name() == "b" {
				t.Fatal("lower score won")
			}
		}
		for _, n := range []string{"a", "c", "d"} {
			if seen[n] < 50 {
				t.Fatalf("%s: tie-break not uniform: %v", params, seen)
			}
		}
	}
}

func TestRandomPicksDistinct(t *testing.T) {
	p := build(t, NewRandom, `{"maxNumOfEndpoints": 3}`)
	seen := map[string]int{}
	for range 400 {
		r := p.Pick(context.Background(), nil, nil, scored(0, 0, 0, 0))
		if len(r.Targets) != 3 {
			t.Fatalf("got %d targets", len(r.Targets))
		}
		uniq := map[string]bool{}
		for _, e := range r.Targets {
			uniq[e.Name()] = true
		}
		if len(uniq) != 3 {
			t.Fatalf("duplicate target in %q", names(r))
		}
		seen[r.Targets[0].Name()]++
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		if seen[n] < 50 {
			t.Fatalf("primary not uniform: %v", seen)
		}
	}
}

// Weighted random picks in proportion to score: with scores 3:1 the first
// endpoint should be primary about 75% of the time, and a zero score only
// when nothing else is left.
func TestWeightedRandomProportional(t *testing.T) {
	p := build(t, NewWeightedRandom, "")
	n, hits := 4000, 0
	for range n {
		r := p.Pick(context.Background(), nil, nil, scored(0.75, 0.25, 0))
		switch r.Targets[0].Name() {
		case "a":
			hits++
		case "c":
			t.Fatal("zero-score endpoint picked while others remain")
		}
	}
	if frac := float64(hits) / float64(n); frac < 0.70 || frac > 0.80 {
		t.Fatalf("share of a = %.3f, want ≈ 0.75", frac)
	}
	p3 := build(t, NewWeightedRandom, `{"maxNumOfEndpoints": 3}`)
	if r := p3.Pick(context.Background(), nil, nil, scored(0.75, 0.25, 0)); r.Targets[2].Name() != "c" {
		t.Fatalf("zero-score endpoint should come last, got %q", names(r))
	}
}

func TestPickerParams(t *testing.T) {
	for _, f := range []scheduling.Factory{NewMaxScore, NewRandom, NewWeightedRandom} {
		if _, err := f("", []byte(`{"maxNumOfEndpoints": 0}`), &scheduling.Handle{}); err == nil {
			t.Error("maxNumOfEndpoints 0 accepted")
		}
		if _, err := f("", []byte(`{"maxEndpoints": 2}`), &scheduling.Handle{}); err == nil {
			t.Error("unknown parameter accepted")
		}
	}
}
