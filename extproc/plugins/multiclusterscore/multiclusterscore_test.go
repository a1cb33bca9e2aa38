package multiclusterscore

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestScore(t *testing.T) {
	const kv, queue = "llm_d_epp_average_kv_cache_utilization", "llm_d_epp_average_queue_size"
	for _, tc := range []struct {
		name   string
		new    scheduling.Factory
		metric string
		values []string // "": the cluster's page has no such metric
		want   []float64
	}{
		{"kv: 1 - utilization", NewKVCache, kv, []string{"0", "0.25", "1"}, []float64{1, 0.75, 0}},
		{"kv: missing scores 0", NewKVCache, kv, []string{"0.5", ""}, []float64{0.5, 0}},
		{"kv: out of range clamps", NewKVCache, kv, []string{"1.5", "-1"}, []float64{0, 1}},
		{"kv: reads only its metric", NewKVCache, queue, []string{"3"}, []float64{0}},
		{"queue: shortest wins", NewQueue, queue, []string{"0", "5", "10"}, []float64{1, 0.5, 0}},
		{"queue: equal queues", NewQueue, queue, []string{"3", "3"}, []float64{1, 1}},
		{"queue: missing scores 0, out of the range", NewQueue, queue, []string{"4", "", "8"}, []float64{1, 0, 0}},
		{"queue: one known", NewQueue, queue, []string{"", "9"}, []float64{0, 1}},
		{"queue: none known", NewQueue, queue, []string{"", ""}, []float64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xp, _ := multiclustermetrics.NewExtractor("x", nil, nil)
			sp, err := tc.new("s", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := sp.(*Scorer)
			if err := s.ResolvePlugins([]scheduling.Plugin{s, xp}); err != nil {
				t.Fatal(err)
			}
			x := xp.(*multiclustermetrics.Extractor)
			var eps []*endpoints.Endpoint
			for i, v := range tc.values {
				e := endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint(i), Address: fmt.Sprintf("10.0.0.%d:443", i+1)})
				page := "other 1\n"
				if v != "" {
					page = tc.metric + " " + v + "\n"
				}
				_ = x.Read(e, []byte(page)) // a metric not on the page is an error; the other is read
				eps = append(eps, e)
			}
			scores := make([]float64, len(eps))
			s.Score(t.Context(), nil, nil, eps, scores)
			if !slices.Equal(scores, tc.want) {
				t.Fatalf("scores %v, want %v", scores, tc.want)
			}
		})
	}
	for _, f := range []scheduling.Factory{NewKVCache, NewQueue} {
		sp, _ := f("s", nil, nil)
		if err := sp.(*Scorer).ResolvePlugins([]scheduling.Plugin{sp}); err == nil {
			t.Errorf("%s resolved without an extractor", sp.TypedName().Type)
		}
		if _, err := f("s", []byte(`{"x":1}`), nil); err == nil {
			t.Errorf("%s accepted a parameter", sp.TypedName().Type)
		}
	}
}
