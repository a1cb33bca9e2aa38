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
	for i, n := range []int64{2, 6, 4} {
		eps[i].AddInflight(n, 0)
	}
	schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), []float64{1, 0, 0.5})
	eps[1].AddInflight(-6, 0) // b's requests finish
	schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), []float64{0.5, 1, 0})
}
