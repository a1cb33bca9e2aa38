package prefixpddecider

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestDisaggregate(t *testing.T) {
	d := schedtest.Endpoint("d", endpoints.Metrics{})
	other := schedtest.Endpoint("o", endpoints.Metrics{})
	tests := []struct {
		name   string
		params string
		prompt int
		held   int // blocks of 16 tokens held by d; -1: no match at all
		want   bool
	}{
		{"disabled by default", "", 1000, 0, false},
		{"cold long prompt", `{"nonCachedTokens":16}`, 1000, 0, true},
		{"mostly cached", `{"nonCachedTokens":512}`, 1000, 40, false},
		{"uncached at the threshold", `{"nonCachedTokens":360}`, 1000, 40, true},
		{"short prompt", `{"nonCachedTokens":16}`, 10, 0, false},
		{"prompt gate", `{"nonCachedTokens":16,"promptTokens":2000}`, 1000, 0, false},
		{"no prefix match stays local", `{"nonCachedTokens":16}`, 1000, -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dec, err := schedtest.Build[*Decider](New, tt.params)
			if err != nil {
				t.Fatal(err)
			}
			cs := scheduling.NewCycleState()
			if tt.held >= 0 {
				m := &prefixmatch.Prediction{BlockTokens: 16, PromptTokens: tt.prompt, Exact: true}
				m.Reset([]*endpoints.Endpoint{other, d})
				m.Matched(0, 60)
				m.Matched(1, float64(tt.held))
				prefixmatch.Publish(cs, m)
			}
			if got := dec.Disaggregate(context.Background(), cs, &scheduling.Request{PromptTokens: tt.prompt}, d); got != tt.want {
				t.Errorf("Disaggregate = %v, want %v", got, tt.want)
			}
		})
	}
	for _, bad := range []string{`{"nonCachedTokens":-1}`, `{"promptTokens":-1}`, `{"threshold":1}`} {
		if _, err := schedtest.Build[*Decider](New, bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
