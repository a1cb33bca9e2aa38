package dataparallel

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

func TestHandler(t *testing.T) {
	rank := endpoints.NewEndpoint(endpoints.Spec{Name: "pod-rank1", Address: "10.0.0.7:8001"})
	for _, tc := range []struct {
		name, params string
		port         int
		err          string
	}{
		{name: "default", port: DefaultPrimaryPort},
		{name: "upstream example", params: `{"primaryPort":8000}`, port: 8000},
		{name: "other port", params: `{"primaryPort":9000}`, port: 9000},
		{name: "zero", params: `{"primaryPort":0}`, err: "between 1 and 65535"},
		{name: "too big", params: `{"primaryPort":65536}`, err: "between 1 and 65535"},
		{name: "unknown", params: `{"port":8000}`, err: `unknown field "port"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("dp", json.RawMessage(tc.params), &scheduling.Handle{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h := p.(*Handler)
			if h.TypedName().Type != Type || h.TypedName().Name != "dp" {
				t.Fatalf("typed name %v", h.TypedName())
			}
			ctx := context.Background()
			profiles := map[string]*scheduling.Profile{"default": {Name: "default"}}
			if got := h.Pick(ctx, nil, nil, profiles, map[string]*scheduling.ProfileResult{}); len(got) != 1 || got[0].Name != "default" {
				t.Fatalf("first round %v", got)
			}
			results := map[string]*scheduling.ProfileResult{"default": {Targets: []*endpoints.Endpoint{rank}}}
			if got := h.Pick(ctx, nil, nil, profiles, results); len(got) != 0 {
				t.Fatalf("second round %v", got)
			}
			res, err := h.ProcessResults(ctx, nil, nil, results)
			if err != nil {
				t.Fatal(err)
			}
			if res.PrimaryProfile != "default" || res.Primary().Targets[0] != rank {
				t.Fatalf("result %+v: the rank must stay the target", res)
			}
			if got := res.Headers[eppwire.HeaderDataParallel]; got != "10.0.0.7:8001" {
				t.Fatalf("%s = %q", eppwire.HeaderDataParallel, got)
			}
			if res.DestinationPort != tc.port {
				t.Fatalf("destination port %d, want %d", res.DestinationPort, tc.port)
			}
			// TestAllFilteredLikeSingle: the scheduler fails it with the
			// profile's error.
			if res, err := h.ProcessResults(ctx, nil, nil, map[string]*scheduling.ProfileResult{"default": nil}); err != nil || res.Primary() != nil || res.Headers[eppwire.HeaderDataParallel] != "" {
				t.Fatalf("a profile that picked nothing: %+v, %v; want no primary and no header", res, err)
			}
			if h.ValidateProfiles([]string{"a", "b"}) == nil || h.ValidateProfiles([]string{"a"}) != nil {
				t.Fatal("exactly one profile")
			}
		})
	}
}
