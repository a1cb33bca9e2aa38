// Package saturation is the pool's utilization detector: how close the
// fleet is to being unable to take more work, from each endpoint's queue
// depth, KV-cache use and metric freshness. The picker sheds sheddable
// requests (negative priority) while the pool is saturated.
package saturation

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/duration"
)

// Config is the EndpointPickerConfig `saturationDetector` section.
type Config struct {
	QueueDepthThreshold       int               `json:"queueDepthThreshold"`
	KVCacheUtilThreshold      float64           `json:"kvCacheUtilThreshold"`
	MetricsStalenessThreshold duration.Duration `json:"metricsStalenessThreshold"`
}

// Defaults as in GIE.
func Defaults() Config {
	return Config{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStalenessThreshold: duration.Duration(200 * time.Millisecond)}
}

// Validate reports the first out-of-range field.
func (c Config) Validate() error {
	switch {
	case c.QueueDepthThreshold <= 0:
		return fmt.Errorf("saturationDetector.queueDepthThreshold must be positive, got %d", c.QueueDepthThreshold)
	case c.KVCacheUtilThreshold <= 0 || c.KVCacheUtilThreshold > 1:
		return fmt.Errorf("saturationDetector.kvCacheUtilThreshold must be in (0, 1], got %v", c.KVCacheUtilThreshold)
	case c.MetricsStalenessThreshold <= 0:
		return fmt.Errorf("saturationDetector.metricsStalenessThreshold must be positive, got %v", time.Duration(c.MetricsStalenessThreshold))
	}
	return nil
}

// Detector computes pool saturation. It is stateless and safe for
// concurrent use.
type Detector struct {
	cfg Config
	now func() time.Time
}

// New returns a detector judging staleness with now.
func New(cfg Config, now func() time.Time) *Detector {
	return &Detector{cfg: cfg, now: now}
}

// Endpoint is one endpoint's saturation: max(queue/threshold,
// kv/threshold), or 1 when its metrics are too old to trust.
func (d *Detector) Endpoint(e *endpoints.Endpoint, now time.Time) float64 {
	if e.MetricsAge(now) > time.Duration(d.cfg.MetricsStalenessThreshold) {
		return 1
	}
	m := e.Metrics()
	return max(float64(m.WaitingQueueSize)/float64(d.cfg.QueueDepthThreshold), m.KVCacheUsage/d.cfg.KVCacheUtilThreshold)
}

// Pool is the mean endpoint saturation; an empty pool is saturated.
func (d *Detector) Pool(eps []*endpoints.Endpoint) float64 {
	if len(eps) == 0 {
		return 1
	}
	now := d.now()
	sum := 0.0
	for _, e := range eps {
		sum += d.Endpoint(e, now)
	}
	return sum / float64(len(eps))
}

// Saturated reports whether the pool has no headroom left.
func (d *Detector) Saturated(eps []*endpoints.Endpoint) bool { return d.Pool(eps) >= 1 }
