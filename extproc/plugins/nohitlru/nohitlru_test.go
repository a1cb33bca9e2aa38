package nohitlru

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// decide scores eps with the match held (nil: no match published), then
// routes to eps[to] as the picker would.
func decide(t *testing.T, s *Scorer, eps []*endpoints.Endpoint, held []float64, to int) []float64 {
	t.Helper()
	cs := scheduling.NewCycleState()
	if held != nil {
		p := &prefixmatch.Prediction{BlockTokens: 16, PromptTokens: 160}
		p.Reset(eps)
		for i, h := range held {
			p.Matched(i, h)
		}
		prefixmatch.Publish(cs, p)
	}
	scores := make([]float64, len(eps))
	s.Score(context.Background(), cs, &scheduling.Request{}, eps, scores)
	s.PreRequest(context.Background(), cs, &scheduling.Request{}, &scheduling.Result{PrimaryProfile: "d",
		Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{eps[to]}}}})
	return scores
}

func TestColdRequestsSpread(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{}), schedtest.Endpoint("c", endpoints.Metrics{})}
	// Nothing used yet: candidate order, 1 down to 0.
	schedtest.ExpectScores(t, decide(t, s, eps, nil, 1), []float64{1, 0.5, 0})
	// b was given a cold request: a and c (never used) first, b last.
	schedtest.ExpectScores(t, decide(t, s, eps, []float64{0, 0, 0}, 2), []float64{1, 0, 0.5})
	// Now b is the least recently used of b and c; a never used.
	schedtest.ExpectScores(t, decide(t, s, eps, nil, 0), []float64{1, 0.5, 0})
	// A warm request (a candidate holds blocks) is neutral and moves nothing.
	schedtest.ExpectScores(t, decide(t, s, eps, []float64{0, 3, 0}, 1), []float64{0.5, 0.5, 0.5})
	// Order oldest first: b, c, a.
	schedtest.ExpectScores(t, decide(t, s, eps, nil, 0), []float64{0, 1, 0.5})
}

func TestLRUBoundAndRemoval(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{"lruSize": 2}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{}), schedtest.Endpoint("c", endpoints.Metrics{})}
	for _, to := range []int{0, 1, 2} {
		decide(t, s, eps, nil, to)
	}
	if len(s.at) != 2 || s.order.Len() != 2 {
		t.Fatalf("LRU holds %d entries, bound 2", len(s.at))
	}
	if _, ok := s.at[eps[0].Address()]; ok {
		t.Fatal("the oldest entry was not evicted")
	}
	s.EndpointsRemoved([]string{eps[1].Address()})
	if _, ok := s.at[eps[1].Address()]; ok || s.order.Len() != 1 {
		t.Fatal("removed endpoint kept")
	}
}

// A named producer must exist and produce a prefix match.
func TestResolve(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{"prefixMatchInfoProducerName": "p"}`)
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) (scheduling.Plugin, bool) { return nil, false }
	if err := s.Resolve(none); err == nil {
		t.Fatal("dangling producer name accepted")
	}
	notSource := func(string) (scheduling.Plugin, bool) { return s, true }
	if err := s.Resolve(notSource); err == nil {
		t.Fatal("a plugin without a match accepted as producer")
	}
	if _, err := New("", []byte(`{"lruSize": 0}`), nil); err == nil {
		t.Fatal("lruSize 0 accepted")
	}
}
