package tokenload

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestScore(t *testing.T) {
	tests := []struct {
		params string
		tokens []int64
		want   []float64
	}{
		{"", []int64{0, 2_097_152, 9_000_000}, []float64{1, 0.5, 0}},
		{`{"capacityTokens": 1000}`, []int64{250}, []float64{0.75}},
	}
	for _, tc := range tests {
		s, err := schedtest.Build[scheduling.Scorer](New, tc.params)
		if err != nil {
			t.Fatal(err)
		}
		eps := make([]*endpoints.Endpoint, len(tc.tokens))
		for i, n := range tc.tokens {
			eps[i] = schedtest.Endpoint("e", endpoints.Metrics{})
			eps[i].Charge(0, 0, 0, n)
		}
		schedtest.ExpectScores(t, schedtest.Score(s, &scheduling.Request{}, eps...), tc.want)
	}
	for _, bad := range []string{`{"capacityTokens": 0}`, `{"capacity": 5}`} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
