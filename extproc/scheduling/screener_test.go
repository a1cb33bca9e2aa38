package scheduling_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// allow is a screener keeping endpoints by name; it records what it saw.
type allow struct {
	scheduling.Named
	names map[string]bool
	saw   []string
}

func (a *allow) Screen(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	a.saw = a.saw[:0]
	var out []*endpoints.Endpoint
	for _, e := range eps {
		a.saw = append(a.saw, e.Name())
		if a.names[e.Name()] {
			out = append(out, e)
		}
	}
	return out
}

// Screeners run before the profiles on the same candidates; the profiles
// see only what all of them keep; none kept is ErrScreenedOut, an
// ErrNoCandidates.
func TestScreeners(t *testing.T) {
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		screens  []map[string]bool
		want     string
		screened bool
	}{
		{name: "none", want: "b"},
		{name: "one keeps a", screens: []map[string]bool{set("a")}, want: "a"},
		{name: "intersection", screens: []map[string]bool{set("a", "c"), set("c", "b")}, want: "c"},
		{name: "disjoint", screens: []map[string]bool{set("a"), set("b")}, screened: true},
		{name: "none kept", screens: []map[string]bool{set()}, screened: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{}), schedtest.Endpoint("c", endpoints.Metrics{})}
			sc := &fixed{Named: scheduling.NewNamed("fixed", "f"), scores: map[string]float64{"a": 0.1, "b": 0.9, "c": 0.5}}
			p := &scheduling.Profile{Name: "default", Scorers: []scheduling.WeightedScorer{{Scorer: sc, Weight: 1}}, Picker: maxPicker(t, "1")}
			var stages scheduling.Stages
			var screeners []*allow
			for _, names := range tc.screens {
				a := &allow{Named: scheduling.NewNamed("allow", ""), names: names}
				screeners = append(screeners, a)
				stages.Screeners = append(stages.Screeners, a)
			}
			s := scheduling.NewScheduler(single(t), map[string]*scheduling.Profile{"default": p}, nil, stages)
			res, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps)
			if tc.screened {
				if !errors.Is(err, scheduling.ErrScreenedOut) || !errors.Is(err, scheduling.ErrNoCandidates) {
					t.Fatalf("err = %v, want ErrScreenedOut", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Primary().Targets[0].Name(); got != tc.want {
				t.Fatalf("picked %s, want %s", got, tc.want)
			}
			for _, a := range screeners {
				if !slices.Equal(a.saw, []string{"a", "b", "c"}) {
					t.Fatalf("a screener saw %v, want every candidate", a.saw)
				}
			}
			if eps[0].Name() != "a" || eps[1].Name() != "b" || eps[2].Name() != "c" {
				t.Fatal("the caller's candidates were modified")
			}
		})
	}
}
