package multiclusterqueue

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestScore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queues []string // "" : the cluster's page has no queue metric
		want   []float64
	}{
		{"shortest wins", []string{"0", "5", "10"}, []float64{1, 0.5, 0}},
		{"equal queues", []string{"3", "3"}, []float64{1, 1}},
		{"missing scores 0, out of the range", []string{"4", "", "8"}, []float64{1, 0, 0}},
		{"one known", []string{"", "9"}, []float64{0, 1}},
		{"none known", []string{"", ""}, []float64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xp, _ := multiclustermetrics.NewExtractor("x", nil, nil)
			sp, err := New("q", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := sp.(*Scorer)
			if err := s.ResolvePlugins([]scheduling.Plugin{s, xp}); err != nil {
				t.Fatal(err)
			}
			x := xp.(*multiclustermetrics.Extractor)
			var eps []*endpoints.Endpoint
			for i, q := range tc.queues {
				e := endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint(i), Address: fmt.Sprintf("10.0.0.%d:443", i+1)})
				page := "other 1\n"
				if q != "" {
					page = "llm_d_epp_average_queue_size " + q + "\n"
				}
				if err := x.Read(e, []byte(page)); err != nil {
					t.Fatal(err)
				}
				eps = append(eps, e)
			}
			scores := make([]float64, len(eps))
			s.Score(t.Context(), nil, nil, eps, scores)
			if !slices.Equal(scores, tc.want) {
				t.Fatalf("scores %v, want %v", scores, tc.want)
			}
		})
	}
	sp, _ := New("q", nil, nil)
	if err := sp.(*Scorer).ResolvePlugins([]scheduling.Plugin{sp}); err == nil {
		t.Fatal("resolved without an extractor")
	}
	if _, err := New("q", []byte(`{"x":1}`), nil); err == nil {
		t.Fatal("a parameter was accepted")
	}
}
