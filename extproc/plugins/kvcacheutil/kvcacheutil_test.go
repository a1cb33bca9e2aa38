package kvcacheutil

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestScore(t *testing.T) {
	s, err := schedtest.Build[scheduling.Scorer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	got := schedtest.Score(s, &scheduling.Request{},
		schedtest.Endpoint("a", endpoints.Metrics{KVCacheUsage: 0.25}),
		schedtest.Endpoint("b", endpoints.Metrics{KVCacheUsage: 1}),
		schedtest.Endpoint("c", endpoints.Metrics{}))
	schedtest.ExpectScores(t, got, []float64{0.75, 0, 1})
}
