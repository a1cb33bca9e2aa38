package prefixmatch

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Uncached work is the prompt less what a candidate holds, so the prompt's
// length must be counted like the held tokens: the precise scorer's exact
// tokenization beats the picker's length-based estimate of a text prompt,
// which once made every candidate look fully cached.
func TestPromptLength(t *testing.T) {
	tests := []struct {
		name     string
		p        Prediction
		estimate int
		want     int
	}{
		{name: "exact wins over a low estimate", p: Prediction{PromptTokens: 900, Exact: true}, estimate: 300, want: 900},
		{name: "exact wins over a high estimate", p: Prediction{PromptTokens: 200, Exact: true}, estimate: 300, want: 200},
		{name: "whole blocks of an estimate never exceed it", p: Prediction{PromptTokens: 256}, estimate: 300, want: 300},
		{name: "approximate blocks above a low estimate", p: Prediction{PromptTokens: 512}, estimate: 300, want: 512},
		{name: "nothing matched", p: Prediction{Exact: true}, estimate: 40, want: 40},
	}
	for _, tt := range tests {
		if got := tt.p.Prompt(tt.estimate); got != tt.want {
			t.Errorf("%s: Prompt(%d) = %d, want %d", tt.name, tt.estimate, got, tt.want)
		}
	}
}

// With both prefix scorers configured, the exact match stands whichever
// produced first, and a match that knows nothing never replaces one.
func TestPublishPrecedence(t *testing.T) {
	exact := &Prediction{PromptTokens: 100, Exact: true}
	approx := &Prediction{PromptTokens: 96}
	empty := &Prediction{Exact: true}
	tests := []struct {
		name  string
		order []*Prediction
		want  *Prediction
	}{
		{"approx then exact", []*Prediction{approx, exact}, exact},
		{"exact then approx", []*Prediction{exact, approx}, exact},
		{"empty after approx", []*Prediction{approx, empty}, approx},
		{"empty alone", []*Prediction{empty}, nil},
	}
	for _, tt := range tests {
		cs := scheduling.NewCycleState()
		for _, p := range tt.order {
			Publish(cs, p)
		}
		got, _ := scheduling.Read(cs, MatchKey)
		if got != tt.want {
			t.Errorf("%s: published %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// Holds lets a consumer skip every candidate's read when nobody holds the
// prompt: it must never be false while some candidate holds blocks, and a
// reused Prediction must start over at Reset.
func TestHolds(t *testing.T) {
	eps := []*endpoints.Endpoint{
		endpoints.NewEndpoint(endpoints.Spec{Name: "a", Address: "10.0.0.1:8000"}),
		endpoints.NewEndpoint(endpoints.Spec{Name: "b", Address: "10.0.0.2:8000"}),
	}
	tests := []struct {
		name    string
		matched []float64 // blocks recorded for eps[0], eps[1], in order
		want    bool
	}{
		{"nothing recorded", nil, false},
		{"zeros recorded", []float64{0, 0}, false},
		{"one holds", []float64{0, 1.5}, true},
		{"a later zero keeps it", []float64{2, 0}, true},
		{"reset after a match", []float64{0, 0}, false},
	}
	var p Prediction
	for _, tt := range tests {
		p.Reset(eps) // reused: the previous case's state must not leak
		p.BlockTokens, p.PromptTokens = 16, 64
		for i, b := range tt.matched {
			p.Matched(i, b)
		}
		if got := p.Holds(); got != tt.want {
			t.Errorf("%s: Holds() = %v, want %v", tt.name, got, tt.want)
		}
		if !p.Holds() {
			for i, e := range eps {
				if p.HeldTokens(i) != 0 || p.HeldTokensOf(e) != 0 {
					t.Errorf("%s: Holds() false but candidate %d holds %d tokens", tt.name, i, p.HeldTokens(i))
				}
			}
		}
	}
}
