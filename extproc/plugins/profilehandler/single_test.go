package profilehandler

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestSingle(t *testing.T) {
	p, err := NewSingle("", nil, &scheduling.Handle{})
	if err != nil {
		t.Fatal(err)
	}
	h := p.(*Single)
	ctx := context.Background()
	profiles := map[string]*scheduling.Profile{"only": {Name: "only"}}
	first := h.Pick(ctx, nil, nil, profiles, map[string]*scheduling.ProfileResult{})
	if len(first) != 1 || first[0].Name != "only" {
		t.Fatalf("first round picked %v", first)
	}
	results := map[string]*scheduling.ProfileResult{"only": {}}
	if next := h.Pick(ctx, nil, nil, profiles, results); len(next) != 0 {
		t.Fatalf("second round picked %v", next)
	}
	res, err := h.ProcessResults(ctx, nil, nil, results)
	if err != nil || res.PrimaryProfile != "only" {
		t.Fatalf("result %+v, %v", res, err)
	}
	if h.ValidateProfiles([]string{"a", "b"}) == nil || h.ValidateProfiles([]string{"a"}) != nil {
		t.Fatal("ValidateProfiles must accept exactly one profile")
	}
}
