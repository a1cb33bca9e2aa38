package flowpolicy

import (
	"errors"
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// ServiceRegisterer is the Handle service under which the binary offers a
// prometheus.Registerer: program-aware-fairness registers its
// llm_d_epp_program_aware_* metrics there. Without it they are not
// exported.
const ServiceRegisterer = "flowpolicy.registerer"

// programMetrics are llm-d's program-aware-fairness metrics. Series are
// per program and deleted when a program is forgotten, so they are bounded
// by MaxPrograms.
type programMetrics struct {
	jain    prometheus.Gauge
	wait    *prometheus.GaugeVec
	service *prometheus.GaugeVec
}

// newProgramMetrics registers the service gauge only when withService
// (las): its absence is how llm-d's guide tells turn-priority runs.
func newProgramMetrics(reg prometheus.Registerer, withService bool) (*programMetrics, error) {
	m := &programMetrics{
		jain: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llm_d_epp_program_aware_jains_fairness_index",
			Help: "Jain's fairness index over the programs' mean flow-control wait; 1 is perfectly equal."}),
		wait: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llm_d_epp_program_aware_avg_wait_time_milliseconds",
			Help: "Running mean of a program's flow-control queue wait."}, []string{"program_id"}),
		service: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llm_d_epp_program_aware_attained_service_tokens",
			Help: "A program's time-decayed attained service in weighted tokens (output tokens count twice)."}, []string{"program_id"}),
	}
	// A second program-aware-fairness instance shares the first's series.
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(m.jain); errors.As(err, &are) {
		m.jain = are.ExistingCollector.(prometheus.Gauge)
	} else if err != nil {
		return nil, err
	}
	if err := reg.Register(m.wait); errors.As(err, &are) {
		m.wait = are.ExistingCollector.(*prometheus.GaugeVec)
	} else if err != nil {
		return nil, err
	}
	if !withService {
		return m, nil
	}
	if err := reg.Register(m.service); errors.As(err, &are) {
		m.service = are.ExistingCollector.(*prometheus.GaugeVec)
	} else if err != nil {
		return nil, err
	}
	return m, nil
}

// jains is (Σx)² / (n·Σx²) over the programs' mean waits; 1 when none
// waited.
func jains(programs map[string]*program) float64 {
	var sum, sq float64
	n := 0
	for _, pr := range programs {
		if pr.waits == 0 {
			continue
		}
		sum += pr.meanWait
		sq += pr.meanWait * pr.meanWait
		n++
	}
	if n == 0 || sq == 0 {
		return 1
	}
	return sum * sum / (float64(n) * sq)
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
