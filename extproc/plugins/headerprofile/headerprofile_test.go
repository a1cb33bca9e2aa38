package headerprofile

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestHandler(t *testing.T) {
	three := []string{"encode", "prefill", "decode"}
	cases := []struct {
		name     string
		params   string
		profiles []string
		headers  map[string]string
		want     string // "" when no profile runs and the request fails
	}{
		{"header names a profile", "", three, map[string]string{"epp-profile": "prefill"}, "prefill"},
		{"value trimmed", "", three, map[string]string{"epp-profile": "  encode "}, "encode"},
		{"no header: default", "", three, nil, "decode"},
		{"blank header: default", "", three, map[string]string{"epp-profile": "  "}, "decode"},
		{"unknown value fails", "", three, map[string]string{"epp-profile": "other"}, ""},
		{"value is case sensitive", "", three, map[string]string{"epp-profile": "Prefill"}, ""},
		{"default not configured", "", []string{"encode", "prefill"}, nil, ""},
		{"custom default", `{"defaultProfile":"prefill"}`, three, nil, "prefill"},
		{"custom header, any case", `{"headerName":" X-Stage "}`, three, map[string]string{"x-stage": "encode", "epp-profile": "prefill"}, "encode"},
		{"one profile always runs", "", []string{"decode"}, map[string]string{"epp-profile": "other"}, "decode"},
	}
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("h", json.RawMessage(tc.params), &scheduling.Handle{})
			if err != nil {
				t.Fatal(err)
			}
			h := p.(*Handler)
			profiles := map[string]*scheduling.Profile{}
			for _, n := range tc.profiles {
				profiles[n] = &scheduling.Profile{Name: n}
			}
			req := &scheduling.Request{Headers: tc.headers}
			picked := h.Pick(ctx, nil, req, profiles, map[string]*scheduling.ProfileResult{})
			results := map[string]*scheduling.ProfileResult{}
			for _, pr := range picked {
				results[pr.Name] = &scheduling.ProfileResult{}
			}
			if len(picked) > 1 {
				t.Fatalf("picked %d profiles", len(picked))
			}
			if next := h.Pick(ctx, nil, req, profiles, results); len(next) != 0 && len(results) > 0 {
				t.Fatalf("second round picked %v", next)
			}
			res, err := h.ProcessResults(ctx, nil, req, results)
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("ran %s, want an error", res.PrimaryProfile)
			case tc.want != "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && res.PrimaryProfile != tc.want:
				t.Fatalf("primary %s, want %s", res.PrimaryProfile, tc.want)
			}
		})
	}
	if _, err := New("h", json.RawMessage(`{"header":"x"}`), &scheduling.Handle{}); err == nil {
		t.Fatal("unknown parameter accepted")
	}
}
