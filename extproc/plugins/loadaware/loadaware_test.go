package loadaware

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestScore(t *testing.T) {
	tests := []struct {
		params  string
		waiting []int
		want    []float64
	}{
		{"", []int{0, 64, 128, 500}, []float64{0.5, 0.25, 0, 0}},
		{`{"threshold": 10}`, []int{5, 1}, []float64{0.25, 0.45}},
	}
	for _, tc := range tests {
		s, err := schedtest.Build[scheduling.Scorer](New, tc.params)
		if err != nil {
			t.Fatal(err)
		}
		eps := make([]*endpoints.Endpoint, len(tc.waiting))
		for i, q := range tc.waiting {
			eps[i] = schedtest.Endpoint("e", endpoints.Metrics{WaitingQueueSize: q})
		}
		schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), tc.want)
	}
	for _, bad := range []string{`{"threshold": -1}`, `{"threshold": "high"}`} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
