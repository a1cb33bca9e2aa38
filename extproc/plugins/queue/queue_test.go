package queue

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestScore(t *testing.T) {
	tests := []struct {
		name    string
		waiting []int
		want    []float64
	}{
		{"min-max", []int{0, 5, 10}, []float64{1, 0.5, 0}},
		{"all equal", []int{3, 3}, []float64{1, 1}},
		{"one endpoint", []int{7}, []float64{1}},
	}
	s, err := schedtest.Build[scheduling.Scorer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := make([]*endpoints.Endpoint, len(tc.waiting))
			for i, q := range tc.waiting {
				eps[i] = schedtest.Endpoint("e", endpoints.Metrics{WaitingQueueSize: q})
			}
			schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), tc.want)
		})
	}
	if _, err := New("", []byte(`{"bogus": 1}`), &scheduling.Handle{}); err == nil {
		t.Fatal("unknown parameter accepted")
	}
}
