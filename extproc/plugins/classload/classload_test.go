package classload

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

var (
	online = &scheduling.Request{Priority: 100}
	batch  = &scheduling.Request{Priority: -1}
	// Priority 0 is not sheddable: llm-d sheds only negative priorities.
	standard = &scheduling.Request{Priority: 0}
)

// route runs the request's life on e as the director does: charged to e's
// live load by class, then the plugin's PreRequest; the returned func is its
// end (the charge's release).
func route(t *testing.T, s *Scorer, req *scheduling.Request, e *endpoints.Endpoint) func() {
	t.Helper()
	c := e.ChargeClass(req.Priority < 0, 0, 100, 200, 200)
	res := &scheduling.Result{PrimaryProfile: "default", Profiles: map[string]*scheduling.ProfileResult{
		"default": {Targets: []*endpoints.Endpoint{e}},
	}}
	s.PreRequest(context.Background(), scheduling.NewCycleState(), req, res)
	return c.Release
}

func build(t *testing.T, params string) *Scorer {
	t.Helper()
	s, err := schedtest.Build[*Scorer](New, params)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScore(t *testing.T) {
	// a: 4 online; b: 2 online, 6 batch; c: 8 batch.
	load := map[string][2]int{"a": {4, 0}, "b": {2, 6}, "c": {0, 8}}
	tests := []struct {
		name, params string
		req          *scheduling.Request
		want         []float64
	}{
		{"spread, batch by batch", "", batch, []float64{1, 0.25, 0}},
		{"spread, online by online", "", online, []float64{0, 0.5, 1}},
		{"spread, priority 0 is protected", "", standard, []float64{0, 0.5, 1}},
		{"separate, batch away from online", `{"sameClassWeight": 0, "otherClassWeight": 1}`, batch, []float64{0, 0.5, 1}},
		{"separate, online away from batch", `{"sameClassWeight": 0, "otherClassWeight": 1}`, online, []float64{1, 0.25, 0}},
		// 1·online + 1·batch: a 4, b 8, c 8.
		{"total", `{"otherClassWeight": 1}`, online, []float64{1, 0, 0}},
		// online 4, 2 + 0.5·6 = 5, 0.5·8 = 4.
		{"online, batch at half", `{"otherClassWeight": 0.5}`, online, []float64{1, 0, 1}},
		{"apply sheddable scores batch", `{"apply": "sheddable"}`, batch, []float64{1, 0.25, 0}},
		{"apply sheddable leaves online", `{"apply": "sheddable"}`, online, []float64{0, 0, 0}},
		{"apply protected leaves batch", `{"apply": "protected"}`, batch, []float64{0, 0, 0}},
		{"apply protected scores online", `{"apply": "protected"}`, online, []float64{0, 0.5, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, tc.params)
			var eps []*endpoints.Endpoint
			for _, n := range []string{"a", "b", "c"} {
				e := schedtest.Endpoint(n, endpoints.Metrics{})
				eps = append(eps, e)
				for range load[n][0] {
					route(t, s, online, e)
				}
				for range load[n][1] {
					route(t, s, batch, e)
				}
			}
			schedtest.ExpectScores(t, schedtest.Score(s, tc.req, eps...), tc.want)
		})
	}
}

func TestAccount(t *testing.T) {
	s := build(t, "")
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	var ends []func()
	for range 3 {
		ends = append(ends, route(t, s, batch, a))
	}
	endOnline := route(t, s, online, a)
	if p, n := a.InflightByClass(); p != 1 || n != 3 {
		t.Fatalf("a holds %d protected, %d sheddable; want 1, 3", p, n)
	}
	if p, n, eps := s.Totals(); p != 1 || n != 3 || eps != 1 {
		t.Fatalf("totals %d, %d over %d endpoints; want 1, 3 over 1", p, n, eps)
	}
	// The busier endpoint scores lower until its requests finish.
	schedtest.ExpectScores(t, schedtest.Score(s, batch, a, b), []float64{0, 1})
	for _, end := range ends {
		end()
	}
	endOnline()
	if p, n := a.InflightByClass(); p != 0 || n != 0 {
		t.Fatalf("after the responses a holds %d, %d", p, n)
	}
	schedtest.ExpectScores(t, schedtest.Score(s, batch, a, b), []float64{1, 1})

	// A decision without a target adds no endpoint to the totals.
	s.PreRequest(context.Background(), scheduling.NewCycleState(), batch, &scheduling.Result{})
	if _, _, eps := s.Totals(); eps != 1 {
		t.Fatalf("totals over %d endpoints, want 1", eps)
	}
}

// TestFallbackMovesClass: when Envoy served a fallback, the director moves
// the request's charge, and the class count moves with it; the response's
// end then releases it on the fallback. (The scorer's own account, before
// the counts moved into the live load, kept it on the primary.)
func TestFallbackMovesClass(t *testing.T) {
	s := build(t, `{"apply": "sheddable"}`)
	primary, fallback := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	c := primary.ChargeClass(true, 0, 100, 200, 200)
	s.PreRequest(context.Background(), scheduling.NewCycleState(), batch, &scheduling.Result{PrimaryProfile: "p",
		Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{primary, fallback}}}})
	c.Move(fallback)
	if _, n := primary.InflightByClass(); n != 0 {
		t.Fatalf("primary still holds %d sheddable after the fallback served", n)
	}
	if _, n := fallback.InflightByClass(); n != 1 {
		t.Fatalf("fallback holds %d sheddable, want 1", n)
	}
	// The next batch request goes to the primary, which runs none now.
	schedtest.ExpectScores(t, schedtest.Score(s, batch, primary, fallback), []float64{1, 0})
	c.FirstToken()
	c.Release()
	if _, n := fallback.InflightByClass(); n != 0 {
		t.Fatalf("fallback holds %d sheddable after the response", n)
	}
}

func TestEndpointsRemoved(t *testing.T) {
	s := build(t, "")
	a := schedtest.Endpoint("a", endpoints.Metrics{})
	end := route(t, s, batch, a)
	s.EndpointsRemoved([]string{a.Address()})
	if _, n, eps := s.Totals(); n != 0 || eps != 0 {
		t.Fatalf("a removed endpoint kept in the totals: %d sheddable over %d", n, eps)
	}
	// An endpoint back at the same address (a new Endpoint) is counted
	// from its own live load.
	back := schedtest.Endpoint("a", endpoints.Metrics{})
	again := route(t, s, online, back)
	end()
	if p, n, eps := s.Totals(); p != 1 || n != 0 || eps != 1 {
		t.Fatalf("totals %d, %d over %d; want 1, 0 over 1", p, n, eps)
	}
	again()
}

// Two instances (one per direction, each with its own profile weight) read
// the one account: the datastore's.
func TestTwoInstances(t *testing.T) {
	s1, s2 := build(t, `{"apply": "sheddable"}`), build(t, `{"apply": "protected"}`)
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	end := route(t, s1, batch, a)
	endOnline := route(t, s2, online, b)
	schedtest.ExpectScores(t, schedtest.Score(s1, batch, a, b), []float64{0, 1})
	schedtest.ExpectScores(t, schedtest.Score(s2, online, a, b), []float64{1, 0})
	end()
	endOnline()
	schedtest.ExpectScores(t, schedtest.Score(s1, batch, a, b), []float64{1, 1})
	schedtest.ExpectScores(t, schedtest.Score(s2, online, a, b), []float64{1, 1})
}

func TestParams(t *testing.T) {
	for _, good := range []string{"", "{}", `{"apply": "protected", "sameClassWeight": 0, "otherClassWeight": 1}`, `{"sameClassWeight": 0.5}`} {
		if _, err := New("", []byte(good), &scheduling.Handle{}); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	for _, bad := range []string{
		`{"apply": "batch"}`, `{"sameClassWeight": -1}`, `{"otherClassWeight": 2}`,
		`{"sameClassWeight": 0}`, `{"maxSheddable": 10}`, `{"sameClassWeight": "high"}`, `[]`,
	} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestConcurrent(t *testing.T) {
	s := build(t, "")
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				req := online
				if (i+w)%2 == 0 {
					req = batch
				}
				end := route(t, s, req, eps[i%2])
				_ = schedtest.Score(s, req, eps...)
				if i%50 == 0 {
					s.EndpointsRemoved([]string{eps[1].Address()})
				}
				end()
			}
		}()
	}
	for range 4 {
		<-done
	}
	for _, e := range eps {
		if p, n := e.InflightByClass(); p != 0 || n != 0 {
			t.Fatalf("%s holds %d, %d after every request ended", e.Name(), p, n)
		}
	}
}

// TestPlacement runs decisions through the scorer alone (the best score
// wins, the first on a tie) beside uneven online load: spreading gives
// every server the same share of the batch, separating keeps it off the
// servers that carry online requests.
func TestPlacement(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		want         []int64
	}{
		{"spread", `{"apply": "sheddable"}`, []int64{10, 10, 10, 10}},
		{"separate", `{"sameClassWeight": 0, "otherClassWeight": 1}`, []int64{0, 0, 40, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, tc.params)
			var eps []*endpoints.Endpoint
			for i, n := range []string{"a", "b", "c", "d"} {
				e := schedtest.Endpoint(n, endpoints.Metrics{})
				eps = append(eps, e)
				for range []int{6, 3, 0, 1}[i] {
					route(t, s, online, e)
				}
			}
			for range 40 {
				scores := schedtest.Score(s, batch, eps...)
				best := 0
				for i, v := range scores {
					if v > scores[best] {
						best = i
					}
				}
				route(t, s, batch, eps[best])
			}
			for i, e := range eps {
				if _, n := e.InflightByClass(); n != tc.want[i] {
					t.Fatalf("%s holds %d batch requests, want %v", e.Name(), n, tc.want)
				}
			}
		})
	}
}
