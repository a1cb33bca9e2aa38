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

// route runs the request's life on e through the plugin's hooks: counted at
// PreRequest; the returned func is its end (ResponseComplete).
func route(t *testing.T, s *Scorer, req *scheduling.Request, e *endpoints.Endpoint) func() {
	t.Helper()
	cs := scheduling.NewCycleState()
	res := &scheduling.Result{PrimaryProfile: "default", Profiles: map[string]*scheduling.ProfileResult{
		"default": {Targets: []*endpoints.Endpoint{e}},
	}}
	s.PreRequest(context.Background(), cs, req, res)
	return func() {
		s.ResponseComplete(context.Background(), cs, req, &scheduling.Response{Endpoint: e, Complete: true})
	}
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
	if p, n := s.InFlight(a.Address()); p != 1 || n != 3 {
		t.Fatalf("a holds %d protected, %d sheddable; want 1, 3", p, n)
	}
	// The busier endpoint scores lower until its requests finish.
	schedtest.ExpectScores(t, schedtest.Score(s, batch, a, b), []float64{0, 1})
	for _, end := range ends {
		end()
	}
	endOnline()
	if p, n := s.InFlight(a.Address()); p != 0 || n != 0 {
		t.Fatalf("after the responses a holds %d, %d", p, n)
	}
	schedtest.ExpectScores(t, schedtest.Score(s, batch, a, b), []float64{1, 1})

	// A response the plugin did not count (no PreRequest in its cycle)
	// releases nothing, and one is released only once.
	end := route(t, s, batch, b)
	s.ResponseComplete(context.Background(), scheduling.NewCycleState(), batch, &scheduling.Response{})
	end()
	end()
	if _, n := s.InFlight(b.Address()); n != 0 {
		t.Fatalf("b holds %d sheddable, want 0", n)
	}

	// A decision without a target counts nothing.
	s.PreRequest(context.Background(), scheduling.NewCycleState(), batch, &scheduling.Result{})
	if got := len(s.byAddress); got != 2 {
		t.Fatalf("%d accounts, want 2", got)
	}
}

func TestEndpointsRemoved(t *testing.T) {
	s := build(t, "")
	a := schedtest.Endpoint("a", endpoints.Metrics{})
	end := route(t, s, batch, a)
	s.EndpointsRemoved([]string{a.Address()})
	if len(s.byAddress) != 0 {
		t.Fatal("account of a removed endpoint kept")
	}
	// An endpoint back at the same address starts from nothing, and the
	// request still in flight from before releases its old account only.
	again := route(t, s, online, a)
	end()
	if p, n := s.InFlight(a.Address()); p != 1 || n != 0 {
		t.Fatalf("a holds %d, %d; want 1, 0", p, n)
	}
	again()
}

// Two instances (one per direction, each with its own profile weight) keep
// their own accounts: one's ResponseComplete must not release the other's.
func TestTwoInstances(t *testing.T) {
	s1, s2 := build(t, `{"apply": "sheddable"}`), build(t, `{"apply": "protected"}`)
	a := schedtest.Endpoint("a", endpoints.Metrics{})
	cs := scheduling.NewCycleState()
	res := &scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{a}}}}
	for _, s := range []*Scorer{s1, s2} {
		s.PreRequest(context.Background(), cs, batch, res)
	}
	s1.ResponseComplete(context.Background(), cs, batch, &scheduling.Response{})
	if _, n := s1.InFlight(a.Address()); n != 0 {
		t.Fatalf("first instance holds %d", n)
	}
	if _, n := s2.InFlight(a.Address()); n != 1 {
		t.Fatalf("second instance holds %d, want 1 until its own hook runs", n)
	}
	s2.ResponseComplete(context.Background(), cs, batch, &scheduling.Response{})
	if _, n := s2.InFlight(a.Address()); n != 0 {
		t.Fatalf("second instance holds %d", n)
	}
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
	if p, n := s.InFlight(eps[0].Address()); p != 0 || n != 0 {
		t.Fatalf("a holds %d, %d after every request ended", p, n)
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
				if _, n := s.InFlight(e.Address()); n != tc.want[i] {
					t.Fatalf("%s holds %d batch requests, want %v", e.Name(), n, tc.want)
				}
			}
		})
	}
}
