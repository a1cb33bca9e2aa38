package config

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// TestCoordinatorProfiles: llm-d's coordinator guide makes one scheduling
// call per stage, naming it in EPP-Profile; each call must land on its
// stage's server, and a call naming no stage on a decode server.
func TestCoordinatorProfiles(t *testing.T) {
	b := buildUpstream(t, "llm-d-guides-coord-disaggregation-router-coord-disaggregation-values-1.yaml")
	var eps []*endpoints.Endpoint
	for _, role := range []string{"encode", "prefill", "decode"} {
		e := endpoints.NewEndpoint(endpoints.Spec{Name: role, Address: role + ":8000", Labels: map[string]string{"llm-d.ai/role": role}})
		e.SetMetrics(&endpoints.Metrics{})
		eps = append(eps, e)
	}
	body, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"`+strings.Repeat("a prompt ", 50)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ header, want string }{
		{"encode", "encode"}, {"prefill", "prefill"}, {"decode", "decode"}, {"", "decode"}, {"other", ""},
	} {
		req := &scheduling.Request{ID: "r", TargetModel: "m", Body: body, PromptTokens: 100, Headers: map[string]string{}}
		if tc.header != "" {
			req.Headers["epp-profile"] = tc.header
		}
		res, err := b.Scheduler.Schedule(context.Background(), scheduling.NewCycleState(), req, eps)
		if tc.want == "" {
			if err == nil {
				t.Errorf("EPP-Profile %q scheduled, want an error", tc.header)
			}
			continue
		}
		if err != nil {
			t.Fatalf("EPP-Profile %q: %v", tc.header, err)
		}
		if got := res.Primary().Targets[0].Name(); got != tc.want {
			t.Errorf("EPP-Profile %q picked %s, want %s", tc.header, got, tc.want)
		}
	}
}
