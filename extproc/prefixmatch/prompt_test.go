package prefixmatch

import (
	"testing"

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
