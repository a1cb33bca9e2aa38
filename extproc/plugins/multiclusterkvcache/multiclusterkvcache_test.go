package multiclusterkvcache

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
		queues []string // "": the cluster's page has no KV metric
		want   []float64
	}{
		{"1 - utilization", []string{"0", "0.25", "1"}, []float64{1, 0.75, 0}},
		{"missing scores 0", []string{"0.5", ""}, []float64{0.5, 0}},
		{"out of range clamps", []string{"1.5", "-1"}, []float64{0, 1}},
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
					page = "llm_d_epp_average_kv_cache_utilization " + q + "\n"
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
