package flowpolicy

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/plugins/classload"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// presenceWith builds presence-holdback-policy resolved against a real
// class-load-scorer named "classes".
func presenceWith(t *testing.T, params string) (*Presence, *classload.Scorer) {
	t.Helper()
	cl, err := classload.New("classes", json.RawMessage(`{"apply": "sheddable"}`), &scheduling.Handle{})
	if err != nil {
		t.Fatal(err)
	}
	p := build(t, NewPresence, params, nil).(*Presence)
	lookup := func(name string) (scheduling.Plugin, bool) { return cl, name == "classes" }
	if err := p.Resolve(lookup); err != nil {
		t.Fatal(err)
	}
	return p, cl.(*classload.Scorer)
}

// place runs a request's placement on e as the director does (charged to
// e's live load by class, then the scorer's PreRequest) and returns its end.
func place(s *classload.Scorer, priority int, e *endpoints.Endpoint) func() {
	c := e.ChargeClass(priority < 0, 0, 100, 200, 200)
	s.PreRequest(context.Background(), scheduling.NewCycleState(), &scheduling.Request{Priority: priority}, &scheduling.Result{PrimaryProfile: "p",
		Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{e}}}})
	return c.Release
}

func TestPresenceCeilings(t *testing.T) {
	p, cl := presenceWith(t, `{"classLoadPluginRef": "classes", "ceiling": 0.2, "perProtected": 0.01, "minCeiling": 0.05}`)
	a, b := ep(0, 0, 0, 0, 0, 0), ep(1, 0, 0, 0, 0, 0)
	prios := []int{100, 0, -1, -5}
	check := func(what string, want float64) {
		t.Helper()
		got := []float64{1, 1, 1, 1}
		p.Ceilings(0.5, prios, got)
		for i, w := range []float64{1, 1, want, want} {
			if math.Abs(got[i]-w) > 1e-9 {
				t.Fatalf("%s: ceilings %v, want protected bands 1 and sheddable ones %v", what, got, want)
			}
		}
	}
	check("no traffic yet", 0.2)
	var ends []func()
	for range 6 {
		ends = append(ends, place(cl, 100, a))
	}
	ends = append(ends, place(cl, -1, b), place(cl, -1, b))
	// 6 protected over the 2 endpoints the scorer knows: 0.2 − 0.01·3.
	check("6 online on 2 servers", 0.17)
	// Sheddable requests do not lower it.
	ends = append(ends, place(cl, -1, a))
	check("with more batch", 0.17)
	for range 40 {
		ends = append(ends, place(cl, 0, b))
	}
	// Priority 0 is protected; 46 over 2 would be −0.03: the floor holds.
	check("online heavy", 0.05)
	for _, end := range ends {
		end()
	}
	check("online gone", 0.2)
}

// Through the Controller: a batch request is held while online requests
// run and dispatched once they end, at the same saturation.
func TestPresenceHoldsBatchWhileOnlineRuns(t *testing.T) {
	p, cl := presenceWith(t, `{"classLoadPluginRef": "classes", "ceiling": 0.5, "perProtected": 0.1}`)
	e := ep(0, 0, 0, 0, 0, 0)
	band := flowcontrol.BandConfig{Fairness: build(t, NewGlobalStrict, "", nil).(flowcontrol.FairnessPolicy),
		Ordering: build(t, NewFCFS, "", nil).(flowcontrol.OrderingPolicy)}
	c, err := flowcontrol.New(flowcontrol.Config{DefaultBand: band, DefaultNegativeBand: band, UsageLimit: p, Detector: fixed(0.3)},
		flowcontrol.Options{Pool: poolOf{e}})
	if err != nil {
		t.Fatal(err)
	}
	var ends []func()
	for range 3 {
		ends = append(ends, place(cl, 100, e))
	}
	if _, err := c.Enqueue(flowcontrol.Request{ID: "b", FairnessID: "batch", Priority: -1}, now); err != nil {
		t.Fatal(err)
	}
	// Ceiling 0.5 − 0.1·3 = 0.2 ≤ saturation 0.3: held.
	if it := c.Next(now); it != nil {
		t.Fatalf("batch dispatched beside 3 online requests: %v", it.Request().ID)
	}
	// Online traffic still dispatches.
	if _, err := c.Enqueue(flowcontrol.Request{ID: "o", FairnessID: "chat", Priority: 100}, now); err != nil {
		t.Fatal(err)
	}
	if it := c.Next(now); it == nil || it.Request().ID != "o" {
		t.Fatalf("dispatched %v, want the online request", it)
	}
	ends[0]()
	ends[1]()
	// 0.5 − 0.1 = 0.4 > 0.3: the batch request goes.
	if it := c.Next(now); it == nil || it.Request().ID != "b" {
		t.Fatalf("dispatched %v once online left, want the batch request", it)
	}
}

type fixed float64

func (f fixed) Saturation([]*endpoints.Endpoint) float64 { return float64(f) }

func TestPresenceParams(t *testing.T) {
	for _, bad := range []string{
		`{}`,
		`{"ceiling": 0.2, "perProtected": 0.01}`,
		`{"classLoadPluginRef": "classes", "perProtected": 0.01}`,
		`{"classLoadPluginRef": "classes", "ceiling": 0.2}`,
		`{"classLoadPluginRef": "classes", "ceiling": 0, "perProtected": 0.01}`,
		`{"classLoadPluginRef": "classes", "ceiling": 1.5, "perProtected": 0.01}`,
		`{"classLoadPluginRef": "classes", "ceiling": 0.2, "perProtected": -1}`,
		`{"classLoadPluginRef": "classes", "ceiling": 0.2, "perProtected": 0.01, "minCeiling": 0.3}`,
		`{"classLoadPluginRef": "classes", "ceiling": 0.2, "perProtected": 0.01, "threshold": 0.3}`,
	} {
		if _, err := NewPresence("", json.RawMessage(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	p := build(t, NewPresence, `{"classLoadPluginRef": "classes", "ceiling": 0.2, "perProtected": 0.01}`, nil).(*Presence)
	if err := p.Resolve(func(string) (scheduling.Plugin, bool) { return nil, false }); err == nil {
		t.Error("a dangling classLoadPluginRef resolved")
	}
	fcfs := build(t, NewFCFS, "", nil)
	if err := p.Resolve(func(string) (scheduling.Plugin, bool) { return fcfs, true }); err == nil {
		t.Error("a classLoadPluginRef naming an ordering policy resolved")
	}
}
