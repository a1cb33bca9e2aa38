package autoscale

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Signals are what the scaling policies read at one sync, each the value
// of the PromQL the matching ScaledObject trigger runs (the chart's
// templates/autoscaling-*.yaml):
type Signals struct {
	// Now is the time since the start.
	Now time.Duration
	// Replicas is the Deployment's spec.replicas (kube_deployment_status_replicas),
	// Ready its ready pods; Replicas-Ready is kube_deployment_status_replicas_unavailable.
	Replicas, Ready int
	// QueueSize is sum(llm_d_epp_flow_control_queue_size).
	QueueSize float64
	// Running is sum(llm_d_epp_request_running).
	Running float64
	// PoolSaturation is max(llm_d_epp_flow_control_pool_saturation), the
	// effective stage.
	PoolSaturation float64
	// InflightTokens is sum(llm_d_epp_inflight_tokens) over the scaled
	// role's endpoints (all of them without P/D).
	InflightTokens float64
	// KVUsage is sum(vllm:kv_cache_usage_perc) over the ready pods.
	KVUsage float64
	// GPUUtil is sum(DCGM_FI_DEV_GPU_UTIL)/100 over the ready pods: each
	// pod's share of time with a kernel running.
	GPUUtil float64
	// SLOSaturation is the smoothed SLO-saturation recording rule (see
	// SLOSignal).
	SLOSaturation float64
}

// Policy is a scaling policy: the replica count to set at a sync.
type Policy interface {
	Name() string
	// Decide returns spec.replicas after the sync described by s.
	Decide(s Signals) (int, error)
}

// Thresholds and behaviours of llm-d's guides
// (guides/workload-autoscaling), which the chart's ScaledObjects default to.
const (
	QueuePerReplica   = 1.0  // epp-queue-size threshold
	RunningPerReplica = 16.0 // epp-running-requests threshold
	SaturationTarget  = 0.7  // pool-saturation threshold
	// PeakPrefillThroughput is the token-aware guide's calibration for
	// Qwen3-32B TP=2 on H100 (tokens/s): the in-flight tokens that make one
	// second of prefill backlog.
	PeakPrefillThroughput = 15928.0
	PrefillBacklogTarget  = 1.5 // prefill-backlog-seconds threshold
	KVTarget              = 0.8 // decode-kv-utilization threshold
	// SLOUp and SLODown are the SLO-saturation hysteresis band.
	SLOUp, SLODown = 0.55, 0.40
	// GPUUtilTarget is the GPU-utilisation baseline's per-pod target.
	GPUUtilTarget = 0.8
)

// Bounds are a ScaledObject's minReplicaCount and maxReplicaCount.
type Bounds struct{ Min, Max int }

// PolicyNames are the built-in policies, in report order.
var PolicyNames = []string{"fixed", "gpu-util", "queue", "saturation", "queue-guard", "token-aware", "slo"}

// Options tune the built-in policies.
type Options struct {
	Bounds Bounds
	// Fixed is the fixed fleet's size (policy "fixed").
	Fixed int
	// PeakPrefillThroughput overrides the token-aware divisor.
	PeakPrefillThroughput float64
}

// NewPolicy builds a built-in policy by name. The behaviours are the
// guides' own for each ScaledObject.
func NewPolicy(name string, o Options) (Policy, error) {
	if name == "fixed" {
		if o.Fixed < 1 {
			return nil, fmt.Errorf("fixed fleet needs at least one replica, got %d", o.Fixed)
		}
		return fixed(o.Fixed), nil
	}
	b, ok := PolicyBehavior(name)
	if !ok {
		return nil, fmt.Errorf("unknown scaling policy %q (%s)", name, strings.Join(PolicyNames, ", "))
	}
	var metrics func(Signals) []Metric
	switch name {
	case "gpu-util":
		// What a plain HPA on DCGM's GPU utilisation does: default
		// behaviour, per-pod target.
		metrics = func(s Signals) []Metric { return []Metric{{"gpu-util", s.GPUUtil, GPUUtilTarget}} }
	case "queue":
		metrics = func(s Signals) []Metric {
			return []Metric{{"epp-queue-size", s.QueueSize, QueuePerReplica}, {"epp-running-requests", s.Running, RunningPerReplica}}
		}
	case "saturation":
		metrics = func(s Signals) []Metric {
			return []Metric{{"pool-saturation", s.PoolSaturation, SaturationTarget}, {"epp-running-requests", s.Running, RunningPerReplica}}
		}
	case "queue-guard":
		metrics = func(s Signals) []Metric { return []Metric{{"composite", QueueGuard(s), 1}} }
	case "token-aware":
		peak := o.PeakPrefillThroughput
		if peak == 0 {
			peak = PeakPrefillThroughput
		}
		if !(peak > 0) {
			return nil, fmt.Errorf("peak prefill throughput must be positive, got %v", peak)
		}
		metrics = func(s Signals) []Metric {
			return []Metric{{"prefill-backlog-seconds", s.InflightTokens / peak, PrefillBacklogTarget}, {"decode-kv-utilization", s.KVUsage, KVTarget}}
		}
	case "slo":
		metrics = func(s Signals) []Metric { return []Metric{{"composite", SLOFormula(s), 1}} }
	}
	h, err := NewHPA(o.Bounds.Min, o.Bounds.Max, b)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	return &hpaPolicy{name: name, hpa: h, metrics: metrics}, nil
}

// PolicyBehavior is the HPA behaviour of a built-in policy, the guide's
// own for each ScaledObject (and the chart's default for it): the queue
// and saturation overlays wait 300 s both ways, queue-guard scales up at
// once (its formula absorbs overshoot), token-aware moves one pod per 180 s
// up and 300 s down, slo is SLOBehavior; gpu-util has the HPA's default.
func PolicyBehavior(name string) (Behavior, bool) {
	window := func(up time.Duration) Behavior {
		return Behavior{
			ScaleUp:   Rules{StabilizationWindow: up, Policies: []RatePolicy{{Percent, 100, 15 * time.Second}}},
			ScaleDown: Rules{StabilizationWindow: 300 * time.Second, Policies: []RatePolicy{{Percent, 100, 15 * time.Second}}},
		}
	}
	switch name {
	case "gpu-util":
		return DefaultBehavior(), true
	case "queue", "saturation":
		return window(300 * time.Second), true
	case "queue-guard":
		return window(0), true
	case "token-aware":
		return Behavior{
			ScaleUp:   Rules{Policies: []RatePolicy{{Pods, 1, 180 * time.Second}}},
			ScaleDown: Rules{StabilizationWindow: 300 * time.Second, Policies: []RatePolicy{{Pods, 1, 300 * time.Second}}},
		}, true
	case "slo":
		return SLOBehavior(), true
	}
	return Behavior{}, false
}

// SLOBehavior is the SLO-aware guide's HPA behaviour: up by max(100%, 4
// pods) per 60 s after a 30 s window, down one pod per 120 s after a 180 s
// window.
func SLOBehavior() Behavior {
	return Behavior{
		ScaleUp: Rules{StabilizationWindow: 30 * time.Second, Select: SelectMax,
			Policies: []RatePolicy{{Percent, 100, 60 * time.Second}, {Pods, 4, 60 * time.Second}}},
		ScaleDown: Rules{StabilizationWindow: 180 * time.Second,
			Policies: []RatePolicy{{Pods, 1, 120 * time.Second}}},
	}
}

type fixed int

func (fixed) Name() string                  { return "fixed" }
func (f fixed) Decide(Signals) (int, error) { return int(f), nil }

type hpaPolicy struct {
	name    string
	hpa     *HPA
	metrics func(Signals) []Metric
}

func (p *hpaPolicy) Name() string { return p.name }

func (p *hpaPolicy) Decide(s Signals) (int, error) {
	return p.hpa.Decide(s.Now, s.Replicas, p.metrics(s))
}

// QueueGuard is the queue-guard overlay's scalingModifiers formula:
// demand = max(queue/1, running/16); demand when it does not exceed the
// replicas, else max(demand − pending, replicas).
func QueueGuard(s Signals) float64 {
	demand := max(s.QueueSize/QueuePerReplica, s.Running/RunningPerReplica)
	n := float64(s.Replicas)
	if demand <= n {
		return demand
	}
	return max(demand-float64(s.Replicas-s.Ready), n)
}

// SLOFormula is the SLO-aware guide's control law: with s the smoothed
// SLO saturation, n the provisioned and r the ready replicas and the
// in-flight credit c = r/n (1 unless 0 < r < n), d = n + ⌈n(s·c/θup − 1)⌉
// above θup, n − ⌊n(1 − s/θdn)⌋ below θdn, n in between.
func SLOFormula(s Signals) float64 {
	n := float64(s.Replicas)
	c := 1.0
	if s.Ready > 0 && s.Ready < s.Replicas {
		c = float64(s.Ready) / n
	}
	switch sat := s.SLOSaturation; {
	case sat > SLOUp:
		return n + math.Ceil(n*(sat*c/SLOUp-1))
	case sat < SLODown:
		return n - math.Floor(n*(1-sat/SLODown))
	}
	return n
}

// SLOSignal is the SLO-aware guide's recording rules on the virtual clock:
// every Interval, s_raw = max(p90 TTFT / S_ttft, p90 TPOT / S_tpot) over
// the last Window of samples (NaN or no traffic: 0), clamped at Clamp, and
// the signal is the mean of the clamped values recorded within Smooth
// (avg_over_time). Samples are the predicted latencies when the picker
// predicts, the measured ones otherwise, as the rules prefer.
type SLOSignal struct {
	TTFT, TPOT time.Duration
	// Window (1m), Smooth (45s) and Clamp (2) default to the guide's.
	Window, Smooth time.Duration
	Clamp          float64

	samples []latencySample // within Window, oldest first
	raw     []timedValue    // within Smooth
}

type latencySample struct {
	at         time.Duration
	ttft, tpot time.Duration
}

type timedValue struct {
	at time.Duration
	v  float64
}

// Observe records one request's latencies at time at; a zero TPOT (one
// output token) adds no TPOT sample.
func (g *SLOSignal) Observe(at, ttft, tpot time.Duration) {
	g.samples = append(g.samples, latencySample{at, ttft, tpot})
}

// Evaluate computes the recording rules at now and returns the smoothed
// signal.
func (g *SLOSignal) Evaluate(now time.Duration) float64 {
	window, smooth, clamp := g.Window, g.Smooth, g.Clamp
	if window == 0 {
		window = time.Minute
	}
	if smooth == 0 {
		smooth = 45 * time.Second
	}
	if clamp == 0 {
		clamp = 2
	}
	drop := 0
	for drop < len(g.samples) && g.samples[drop].at <= now-window {
		drop++
	}
	g.samples = g.samples[drop:]
	var ttft, tpot []float64
	for _, s := range g.samples {
		if s.ttft > 0 {
			ttft = append(ttft, s.ttft.Seconds())
		}
		if s.tpot > 0 {
			tpot = append(tpot, s.tpot.Seconds())
		}
	}
	raw := 0.0
	if g.TTFT > 0 {
		raw = max(raw, quantile(ttft, 0.9)/g.TTFT.Seconds())
	}
	if g.TPOT > 0 {
		raw = max(raw, quantile(tpot, 0.9)/g.TPOT.Seconds())
	}
	g.raw = append(g.raw, timedValue{now, min(raw, clamp)})
	drop = 0
	for drop < len(g.raw) && g.raw[drop].at <= now-smooth {
		drop++
	}
	g.raw = g.raw[drop:]
	sum := 0.0
	for _, v := range g.raw {
		sum += v.v
	}
	return sum / float64(len(g.raw))
}

// quantile is the q-quantile of v by linear interpolation between order
// statistics; 0 for no samples (the rules' "no traffic").
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	pos := q * float64(len(v)-1)
	i := int(pos)
	if i+1 >= len(v) {
		return v[len(v)-1]
	}
	return v[i] + (pos-float64(i))*(v[i+1]-v[i])
}
