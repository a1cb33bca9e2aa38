// Package promtext reads single values from Prometheus text pages without
// a Prometheus server: the exporters the picker and the batch processor
// poll directly (the DCGM exporter, a model server's /metrics).
package promtext

import (
	"bytes"
	"fmt"
	"math"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Max is the largest value of metric's samples on page that keep accepts
// (gauges, counters and untyped samples; NaN skipped); false when there is
// none.
func Max(page []byte, metric string, keep func(*dto.Metric) bool) (float64, bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return 0, false, fmt.Errorf("metrics page: %w", err)
	}
	best, found := math.Inf(-1), false
	for _, m := range fams[metric].GetMetric() {
		if !keep(m) {
			continue
		}
		var v float64
		switch {
		case m.GetGauge() != nil:
			v = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			v = m.GetCounter().GetValue()
		case m.GetUntyped() != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		if !math.IsNaN(v) {
			best, found = max(best, v), true
		}
	}
	if !found {
		return 0, false, nil
	}
	return best, true, nil
}
