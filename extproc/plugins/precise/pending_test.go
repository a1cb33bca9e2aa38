package precise

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// route scores req over eps in a fresh cycle, then records that it was
// sent to eps[target]; it returns the cycle and the scores.
func route(t *testing.T, s *Scorer, req *scheduling.Request, eps []*endpoints.Endpoint, target int) (*scheduling.CycleState, []float64) {
	t.Helper()
	cs := scheduling.NewCycleState()
	s.Produce(context.Background(), cs, req, eps)
	scores := make([]float64, len(eps))
	s.Score(context.Background(), cs, req, eps, scores)
	res := &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{eps[target]}}}}
	s.PreRequest(context.Background(), cs, req, res)
	return cs, scores
}

// With speculative indexing, a prompt routed to an endpoint counts as held
// there for the requests routed after it until its response ends (its
// blocks stay resident while it runs; the first token does not release
// them, since the KV events announcing them come later).
func TestSpeculativeMatch(t *testing.T) {
	const prompt = `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`
	tests := []struct {
		name        string
		params      string
		release     func(s *Scorer, cs *scheduling.CycleState)
		wantDuring  float64 // score on the endpoint while the first request is in prefill
		wantRelease float64
	}{
		{name: "off", params: `{"blockSize": 4}`, release: func(*Scorer, *scheduling.CycleState) {}, wantDuring: 0, wantRelease: 0},
		{name: "kept past the first token", params: `{"blockSize": 4, "speculativeIndexing": true}`,
			release: func(*Scorer, *scheduling.CycleState) {}, wantDuring: 1, wantRelease: 1},
		{name: "released at the end", params: `{"blockSize": 4, "speculativeIndexing": true}`,
			release: func(s *Scorer, cs *scheduling.CycleState) {
				s.ResponseComplete(context.Background(), cs, nil, &scheduling.Response{})
			}, wantDuring: 1, wantRelease: 0},
		{name: "bound reached", params: `{"blockSize": 4, "speculativeIndexing": true, "maxSpeculativeEntries": 2}`,
			release: func(*Scorer, *scheduling.CycleState) {}, wantDuring: 0, wantRelease: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := build(t, kvindex.New(kvindex.Config{}), tt.params)
			eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
			first, cold := route(t, s, completion(t, prompt), eps, 1)
			if cold[0] != 0 || cold[1] != 0 {
				t.Fatalf("cold scores %v", cold)
			}
			_, during := route(t, s, completion(t, prompt), eps, 0)
			if during[0] != 0 || during[1] != tt.wantDuring {
				t.Fatalf("scores while in prefill %v, want [0 %v]", during, tt.wantDuring)
			}
			tt.release(s, first)
			// The second request is still pending on a: only b's entries
			// were released.
			cs := scheduling.NewCycleState()
			s.Produce(context.Background(), cs, completion(t, prompt), eps)
			after := make([]float64, 2)
			s.Score(context.Background(), cs, completion(t, prompt), eps, after)
			if after[1] != tt.wantRelease || after[0] != tt.wantDuring {
				t.Fatalf("scores after release %v, want [%v %v]", after, tt.wantDuring, tt.wantRelease)
			}
			s.EndpointsRemoved([]string{eps[0].Address()})
			s.Score(context.Background(), scheduling.NewCycleState(), completion(t, prompt), eps, after)
			if after[0] != 0 {
				t.Fatalf("removed endpoint still holds pending blocks: %v", after)
			}
		})
	}
}
