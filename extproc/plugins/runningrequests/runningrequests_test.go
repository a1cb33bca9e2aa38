package runningrequests

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// The scorer follows the picker's own in-flight count, not the scraped
// running count (which is deliberately contradictory here).
func TestScoreUsesPickerInflight(t *testing.T) {
	s, err := schedtest.Build[scheduling.Scorer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{
		schedtest.Endpoint("a", endpoints.Metrics{RunningRequests: 50}),
		schedtest.Endpoint("b", endpoints.Metrics{RunningRequests: 0}),
		schedtest.Endpoint("c", endpoints.Metrics{RunningRequests: 9}),
	}
	charges := make([][]endpoints.Charge, len(eps))
	for i, n := range []int{2, 6, 4} {
		for range n {
			charges[i] = append(charges[i], eps[i].Charge(0, 0, 0, 0))
		}
	}
	schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), []float64{1, 0, 0.5})
	for i := range charges[1] { // b's requests finish
		charges[1][i].Release()
	}
	schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), []float64{0.5, 1, 0})
}
