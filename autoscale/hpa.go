package autoscale

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// RatePolicyType is an HPA scaling policy's unit.
type RatePolicyType string

// The autoscaling/v2 HPAScalingPolicyType values.
const (
	Pods    RatePolicyType = "Pods"
	Percent RatePolicyType = "Percent"
)

// Select is an HPA scaling rule's selectPolicy.
type Select string

// The autoscaling/v2 ScalingPolicySelect values.
const (
	SelectMax      Select = "Max"
	SelectMin      Select = "Min"
	SelectDisabled Select = "Disabled"
)

// RatePolicy limits how much one direction may change within Period.
type RatePolicy struct {
	Type   RatePolicyType
	Value  int
	Period time.Duration
}

// Rules is one direction's behaviour (HPAScalingRules).
type Rules struct {
	StabilizationWindow time.Duration
	Policies            []RatePolicy
	// Select defaults to SelectMax.
	Select Select
}

// Behavior is an HPA's spec.behavior.
type Behavior struct {
	ScaleUp, ScaleDown Rules
}

// DefaultBehavior is what an HPA does without spec.behavior: up at once by
// max(100%, 4 pods) per 15 s, down by up to 100% per 15 s after a 300 s
// window.
func DefaultBehavior() Behavior {
	return Behavior{
		ScaleUp: Rules{Policies: []RatePolicy{{Percent, 100, 15 * time.Second}, {Pods, 4, 15 * time.Second}}, Select: SelectMax},
		ScaleDown: Rules{StabilizationWindow: 300 * time.Second,
			Policies: []RatePolicy{{Percent, 100, 15 * time.Second}}, Select: SelectMax},
	}
}

// Tolerance is the HPA's default --horizontal-pod-autoscaler-tolerance: a
// usage ratio within 10% of 1 changes nothing.
const Tolerance = 0.1

// SyncPeriod is the HPA controller's default sync period: how often the
// KEDA-made HPA reads its metrics and acts.
const SyncPeriod = 15 * time.Second

// Validate reports the first rule an API server would refuse.
func (b Behavior) Validate() error {
	for _, d := range []struct {
		name string
		r    Rules
	}{{"scaleUp", b.ScaleUp}, {"scaleDown", b.ScaleDown}} {
		if d.r.StabilizationWindow < 0 || d.r.StabilizationWindow > time.Hour {
			return fmt.Errorf("%s.stabilizationWindowSeconds must be 0..3600, got %v", d.name, d.r.StabilizationWindow)
		}
		switch d.r.Select {
		case "", SelectMax, SelectMin, SelectDisabled:
		default:
			return fmt.Errorf("%s.selectPolicy %q is not Max, Min or Disabled", d.name, d.r.Select)
		}
		if len(d.r.Policies) == 0 && d.r.Select != SelectDisabled {
			return fmt.Errorf("%s needs at least one policy", d.name)
		}
		for _, p := range d.r.Policies {
			if p.Type != Pods && p.Type != Percent {
				return fmt.Errorf("%s policy type %q is not Pods or Percent", d.name, p.Type)
			}
			if p.Value <= 0 || p.Period <= 0 || p.Period > 30*time.Minute {
				return fmt.Errorf("%s policy %s needs value > 0 and periodSeconds 1..1800, got %d per %v", d.name, p.Type, p.Value, p.Period)
			}
		}
	}
	return nil
}

// Metric is one metric an HPA scales on, as KEDA hands an external metric
// with an AverageValue target: Value is the query's result for the whole
// target, Target the per-replica value.
type Metric struct {
	Name          string
	Value, Target float64
}

// ErrBadMetric reports a metric the HPA cannot use.
var ErrBadMetric = errors.New("autoscale: bad metric")

// desired is the replica count one AverageValue metric asks for: current
// when the usage ratio is within the tolerance, else ceil(value/target).
func (m Metric) desired(current int) (int, error) {
	if !(m.Target > 0) || math.IsNaN(m.Value) || math.IsInf(m.Value, 0) || m.Value < 0 {
		return 0, fmt.Errorf("%w: %s = %v with target %v", ErrBadMetric, m.Name, m.Value, m.Target)
	}
	if current > 0 {
		ratio := m.Value / (m.Target * float64(current))
		if math.Abs(ratio-1) <= Tolerance {
			return current, nil
		}
	}
	return int(math.Ceil(m.Value / m.Target)), nil
}

// HPA is one HorizontalPodAutoscaler's state: the recommendations and the
// scale events its behaviour looks back on. It is not safe for concurrent
// use.
type HPA struct {
	Min, Max int
	Behavior Behavior

	recs   []timed // recommendations, oldest first
	events []timed // applied changes (n = delta), oldest first
}

type timed struct {
	at time.Duration
	n  int
}

// NewHPA checks the bounds and behaviour.
func NewHPA(minReplicas, maxReplicas int, b Behavior) (*HPA, error) {
	if minReplicas < 1 || maxReplicas < minReplicas {
		return nil, fmt.Errorf("replicas must satisfy 1 ≤ min ≤ max, got min %d max %d", minReplicas, maxReplicas)
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return &HPA{Min: minReplicas, Max: maxReplicas, Behavior: b}, nil
}

// Decide is one sync at now (time since the start): the replica count the
// HPA sets given current (spec.replicas) and the metrics; the largest
// per-metric count wins, as with several metrics on one HPA.
func (h *HPA) Decide(now time.Duration, current int, metrics []Metric) (int, error) {
	if len(metrics) == 0 {
		return current, fmt.Errorf("%w: none", ErrBadMetric)
	}
	raw := 0
	for _, m := range metrics {
		d, err := m.desired(current)
		if err != nil {
			return current, err
		}
		raw = max(raw, d)
	}
	return h.DecideRaw(now, current, raw), nil
}

// DecideRaw applies bounds, stabilization and rate limits to a raw desired
// count, records the recommendation and the change, and returns the count.
func (h *HPA) DecideRaw(now time.Duration, current, raw int) int {
	raw = min(max(raw, h.Min), h.Max)
	rec := h.stabilize(now, current, raw)
	next := h.limit(now, current, rec)
	if d := next - current; d != 0 {
		h.events = append(h.events, timed{now, d})
	}
	return next
}

// stabilize keeps raw in the window history and returns current moved
// only as far as every recommendation in the windows agrees: up to the
// smallest of the scale-up window, down to the largest of the scale-down
// window.
func (h *HPA) stabilize(now time.Duration, current, raw int) int {
	h.recs = append(h.recs, timed{now, raw})
	keep := max(h.Behavior.ScaleUp.StabilizationWindow, h.Behavior.ScaleDown.StabilizationWindow)
	drop := 0
	for drop < len(h.recs) && h.recs[drop].at < now-keep {
		drop++
	}
	h.recs = h.recs[drop:]
	up, down := raw, raw
	for _, r := range h.recs {
		if r.at >= now-h.Behavior.ScaleUp.StabilizationWindow {
			up = min(up, r.n)
		}
		if r.at >= now-h.Behavior.ScaleDown.StabilizationWindow {
			down = max(down, r.n)
		}
	}
	rec := current
	if rec < up {
		rec = up
	}
	if rec > down {
		rec = down
	}
	return rec
}

// limit applies the rate policies to the stabilized recommendation.
func (h *HPA) limit(now time.Duration, current, rec int) int {
	keep := time.Duration(0)
	for _, p := range append(append([]RatePolicy{}, h.Behavior.ScaleUp.Policies...), h.Behavior.ScaleDown.Policies...) {
		keep = max(keep, p.Period)
	}
	drop := 0
	for drop < len(h.events) && h.events[drop].at < now-keep {
		drop++
	}
	h.events = h.events[drop:]
	switch {
	case rec > current:
		return min(rec, max(current, h.rateLimit(now, current, 1)), h.Max)
	case rec < current:
		return max(rec, min(current, h.rateLimit(now, current, -1)), h.Min)
	}
	return rec
}

// changed sums the additions (sign 1) or removals (sign -1) within period.
func (h *HPA) changed(now, period time.Duration, sign int) int {
	n := 0
	for _, e := range h.events {
		if e.at > now-period && e.n*sign > 0 {
			n += e.n * sign
		}
	}
	return n
}

// rateLimit is the furthest the rate policies let one direction go from
// current: sign 1 up, -1 down. Each policy counts from the replicas at its
// period's start; Max selects the policy allowing the largest change, Min
// the smallest.
func (h *HPA) rateLimit(now time.Duration, current, sign int) int {
	r := h.Behavior.ScaleUp
	if sign < 0 {
		r = h.Behavior.ScaleDown
	}
	if r.Select == SelectDisabled {
		return current
	}
	best := 0
	for i, p := range r.Policies {
		start := current - sign*h.changed(now, p.Period, sign)
		var proposed int
		switch {
		case p.Type == Pods:
			proposed = start + sign*p.Value
		case sign > 0:
			proposed = int(math.Ceil(float64(start) * (1 + float64(p.Value)/100)))
		default:
			proposed = int(float64(start) * (1 - float64(p.Value)/100))
		}
		change := sign * (proposed - current)
		if i == 0 || (r.Select == SelectMin) == (change < sign*(best-current)) {
			best = proposed
		}
	}
	return best
}
