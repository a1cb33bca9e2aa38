package joinhold

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// req is one routed request of a scenario.
type req struct {
	ep       string
	uncached int
	stream   bool
	pd       bool
}

// routed is a request the test routed through the plugin.
type routed struct {
	cs *scheduling.CycleState
}

func newPlugin(t *testing.T, params string) *Plugin {
	t.Helper()
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := New("hold", raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Plugin)
}

func route(p *Plugin, eps map[string]*endpoints.Endpoint, r req) routed {
	cs := scheduling.AcquireCycleState()
	ep := eps[r.ep]
	res := &scheduling.Result{PrimaryProfile: "default", Uncached: r.uncached,
		Profiles: map[string]*scheduling.ProfileResult{"default": {Targets: []*endpoints.Endpoint{ep}}}}
	if r.pd {
		res.Prefill = eps["prefill"]
	}
	p.PreRequest(context.Background(), cs, &scheduling.Request{Stream: r.stream}, res)
	return routed{cs: cs}
}

// held reports whether the request still waits.
func (r routed) held(p *Plugin) bool {
	ch, _ := p.Hold(r.cs)
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

func TestHoldOrder(t *testing.T) {
	eps := map[string]*endpoints.Endpoint{}
	for _, n := range []string{"a", "b", "prefill"} {
		eps[n] = endpoints.NewEndpoint(endpoints.Spec{Name: n, Address: "10.0.0." + map[string]string{"a": "1", "b": "2", "prefill": "3"}[n] + ":8000"})
	}
	long, short := 4000, 100
	type step struct {
		// route a request, or end one (by index) at its first token or,
		// with complete, at its response's end or with the cycle state
		// released.
		route              *req
		first, complete    int
		release            int
		wantHeld, wantFree []int
	}
	r := func(ep string, n int) *req { return &req{ep: ep, uncached: n, stream: true} }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a long prompt behind one in prefill waits for its first token", []step{
			{route: r("a", long), wantFree: []int{0}},
			{route: r("a", long), wantHeld: []int{1}},
			{first: 0, complete: -1, release: -1, wantFree: []int{1}},
		}},
		{"short prompts are never held, and a long one waits for them too, those routed after it included", []step{
			{route: r("a", short), wantFree: []int{0}},
			{route: r("a", long), wantHeld: []int{1}},
			{route: r("a", short), wantFree: []int{2}, wantHeld: []int{1}},
			{first: 0, complete: -1, release: -1, wantHeld: []int{1}},
			{first: 2, complete: -1, release: -1, wantFree: []int{1}},
		}},
		{"long prompts go one at a time, in routing order", []step{
			{route: r("a", long), wantFree: []int{0}},
			{route: r("a", long), wantHeld: []int{1}},
			{route: r("a", long), wantHeld: []int{1, 2}},
			{first: 0, complete: -1, release: -1, wantFree: []int{1}, wantHeld: []int{2}},
			{first: 1, complete: -1, release: -1, wantFree: []int{2}},
		}},
		{"endpoints keep lines of their own", []step{
			{route: r("a", long), wantFree: []int{0}},
			{route: r("b", long), wantFree: []int{1}},
		}},
		{"a request that ends without a first token frees its place", []step{
			{route: r("a", long)},
			{route: r("a", long), wantHeld: []int{1}},
			{route: r("a", long), wantHeld: []int{2}},
			{first: -1, complete: 1, release: -1, wantHeld: []int{2}},
			{first: -1, complete: 0, release: -1, wantFree: []int{2}},
		}},
		{"a released cycle state frees its place", []step{
			{route: r("a", long)},
			{route: r("a", long), wantHeld: []int{1}},
			{first: -1, complete: -1, release: 0, wantFree: []int{1}},
		}},
		{"non-streaming and P/D requests are neither held nor waited for", []step{
			{route: &req{ep: "a", uncached: long}, wantFree: []int{0}},
			{route: &req{ep: "a", uncached: long, stream: true, pd: true}, wantFree: []int{1}},
			{route: r("a", long), wantFree: []int{2}},
			{route: &req{ep: "a", uncached: long}, wantFree: []int{3}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlugin(t, `{"minTokens": 512}`)
			var rs []routed
			for k, s := range tc.steps {
				switch {
				case s.route != nil:
					rs = append(rs, route(p, eps, *s.route))
				case s.first >= 0:
					p.FirstToken(context.Background(), rs[s.first].cs, nil, nil)
				case s.complete >= 0:
					p.ResponseComplete(context.Background(), rs[s.complete].cs, nil, nil)
				case s.release >= 0:
					rs[s.release].cs.Release()
				}
				for _, i := range s.wantHeld {
					if !rs[i].held(p) {
						t.Errorf("step %d: request %d goes, want it held", k, i)
					}
				}
				for _, i := range s.wantFree {
					if rs[i].held(p) {
						t.Errorf("step %d: request %d is held, want it to go", k, i)
					}
				}
			}
		})
	}
}

func TestEndpointsRemovedReleases(t *testing.T) {
	ep := endpoints.NewEndpoint(endpoints.Spec{Name: "a", Address: "10.0.0.1:8000"})
	eps := map[string]*endpoints.Endpoint{"a": ep}
	p := newPlugin(t, "")
	route(p, eps, req{ep: "a", uncached: 1000, stream: true})
	held := route(p, eps, req{ep: "a", uncached: 1000, stream: true})
	ch, most := p.Hold(held.cs)
	if ch == nil || most != DefaultMaxHold {
		t.Fatalf("Hold = %v, %v; want a release and the default bound %v", ch, most, DefaultMaxHold)
	}
	p.EndpointsRemoved([]string{"10.0.0.1:8000"})
	select {
	case <-ch:
	default:
		t.Fatal("a removed endpoint's held request is still held")
	}
}

func TestParams(t *testing.T) {
	for _, tc := range []struct{ params, err string }{
		{`{"minTokens": 0}`, "minTokens must be at least 1"},
		{`{"maxHold": "0s"}`, "maxHold must be positive"},
		{`{"maxHold": "-1s"}`, "maxHold must be positive"},
		{`{"minTokens": "many"}`, "minTokens"},
		{`{"holdTokens": 5}`, "holdTokens"},
		{`{"minTokens": 2048, "maxHold": "3s"}`, ""},
	} {
		_, err := New("hold", json.RawMessage(tc.params), nil)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.params, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one naming %q", tc.params, err, tc.err)
		}
	}
}

// TestLinesGoWithTheirRequests checks that the line map keeps nothing for
// an endpoint without requests in prefill: a decision that raced its
// endpoint's removal recreates its line after EndpointsRemoved deleted it,
// and that line must go when the request ends rather than stay forever.
func TestLinesGoWithTheirRequests(t *testing.T) {
	p := newPlugin(t, "")
	for i := range 100 {
		addr := "10.0.1." + strconv.Itoa(i) + ":8000"
		eps := map[string]*endpoints.Endpoint{"a": endpoints.NewEndpoint(endpoints.Spec{Name: "a", Address: addr})}
		before := route(p, eps, req{ep: "a", uncached: 1000, stream: true})
		p.EndpointsRemoved([]string{addr})
		raced := route(p, eps, req{ep: "a", uncached: 1000, stream: true})
		before.cs.Release()
		p.ResponseComplete(context.Background(), raced.cs, nil, nil)
	}
	still := route(p, map[string]*endpoints.Endpoint{"a": endpoints.NewEndpoint(endpoints.Spec{Name: "a", Address: "10.0.2.1:8000"})}, req{ep: "a", uncached: 1000, stream: true})
	p.mu.Lock()
	n := len(p.lines)
	p.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d lines after 100 removed endpoints' requests ended, want 1 (the request still in prefill)", n)
	}
	still.cs.Release()
	if len(p.lines) != 0 {
		t.Fatalf("%d lines after every request ended, want 0", len(p.lines))
	}
}
