package saturation

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestPoolSaturation(t *testing.T) {
	now := time.Unix(1000, 0)
	fresh := func(q int, kv float64) *endpoints.Endpoint {
		return schedtest.Endpoint("e", endpoints.Metrics{WaitingQueueSize: q, KVCacheUsage: kv, UpdateTime: now.Add(-10 * time.Millisecond)})
	}
	stale := schedtest.Endpoint("s", endpoints.Metrics{UpdateTime: now.Add(-time.Second)})
	never := schedtest.Endpoint("n", endpoints.Metrics{})
	d := New(Defaults(), func() time.Time { return now })
	tests := []struct {
		name      string
		eps       []*endpoints.Endpoint
		want      float64
		saturated bool
	}{
		{"idle", []*endpoints.Endpoint{fresh(0, 0)}, 0, false},
		{"queue dominates", []*endpoints.Endpoint{fresh(5, 0.4)}, 1, true},
		{"kv dominates", []*endpoints.Endpoint{fresh(1, 0.4)}, 0.5, false},
		{"mean over pool", []*endpoints.Endpoint{fresh(10, 0), fresh(0, 0)}, 1, true},
		{"stale counts as full", []*endpoints.Endpoint{stale, fresh(0, 0)}, 0.5, false},
		{"never scraped counts as full", []*endpoints.Endpoint{never}, 1, true},
		{"empty pool", nil, 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := d.Pool(tc.eps); got != tc.want {
				t.Fatalf("Pool = %v, want %v", got, tc.want)
			}
			if got := d.Saturated(tc.eps); got != tc.saturated {
				t.Fatalf("Saturated = %v", got)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{QueueDepthThreshold: 0, KVCacheUtilThreshold: 0.8, MetricsStalenessThreshold: 1},
		{QueueDepthThreshold: 5, KVCacheUtilThreshold: 1.5, MetricsStalenessThreshold: 1},
		{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStalenessThreshold: 0},
	}
	for _, c := range bad {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
}
