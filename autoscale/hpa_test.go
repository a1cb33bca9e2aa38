package autoscale

import (
	"math"
	"testing"
	"time"
)

func TestMetricDesired(t *testing.T) {
	for _, c := range []struct {
		name    string
		m       Metric
		current int
		want    int
	}{
		{"ceil of value over target", Metric{"q", 33, 16}, 1, 3},
		{"within tolerance keeps current", Metric{"q", 4.3, 1}, 4, 4},
		{"just outside tolerance moves", Metric{"q", 4.5, 1}, 4, 5},
		{"zero value asks for zero (HPA clamps to min)", Metric{"q", 0, 1}, 3, 0},
		{"composite formula pass-through", Metric{"composite", 7, 1}, 3, 7},
	} {
		got, err := c.m.desired(c.current)
		if err != nil || got != c.want {
			t.Errorf("%s: desired(%d) = %d, %v; want %d", c.name, c.current, got, err, c.want)
		}
	}
	for _, m := range []Metric{{"nan", math.NaN(), 1}, {"neg", -1, 1}, {"no target", 1, 0}, {"inf", math.Inf(1), 1}} {
		if _, err := m.desired(2); err == nil {
			t.Errorf("%s: no error", m.Name)
		}
	}
}

// TestHPABehavior steps an HPA through scale-ups and -downs and checks
// each sync against the autoscaling/v2 rules.
func TestHPABehavior(t *testing.T) {
	s := time.Second
	type step struct {
		at      time.Duration
		current int
		raw     int
		want    int
	}
	for _, c := range []struct {
		name  string
		min   int
		max   int
		b     Behavior
		steps []step
	}{
		{"default behavior: up at once by max(100%, 4), down after 300s", 1, 20, DefaultBehavior(), []step{
			{0, 1, 10, 5},       // 1 + 4 pods beats 1 × 200%
			{15 * s, 5, 10, 10}, // a new period: 5 × 200% = 10
			{30 * s, 10, 2, 10}, // down is held by the window
			{310 * s, 10, 2, 10},
			{331 * s, 10, 2, 2}, // every recommendation in the window is 2
		}},
		{"SLO guide: max(100%, 4 pods) per 60s after 30s, 1 pod per 120s after 180s", 3, 8, SLOBehavior(), []step{
			{0, 3, 3, 3},
			{15 * s, 3, 8, 3}, // the up window still holds the 3
			{31 * s, 3, 8, 7}, // 3 + 4 pods beats 3 × 200%
			{46 * s, 7, 8, 7}, // this period started at 3
			{91 * s, 7, 8, 8},
			{200 * s, 8, 3, 8}, // the down window holds the 8s
			{400 * s, 8, 3, 7}, // one pod
			{415 * s, 7, 3, 7}, // per 120s
			{521 * s, 7, 3, 6},
		}},
		{"token-aware: one pod per 180s", 1, 10, Behavior{
			ScaleUp:   Rules{Policies: []RatePolicy{{Pods, 1, 180 * s}}},
			ScaleDown: Rules{StabilizationWindow: 300 * s, Policies: []RatePolicy{{Pods, 1, 300 * s}}},
		}, []step{
			{0, 1, 5, 2}, {15 * s, 2, 5, 2}, {180 * s, 2, 5, 3}, {195 * s, 3, 5, 3},
		}},
		{"bounds clamp", 2, 4, DefaultBehavior(), []step{{0, 3, 99, 4}}},
		{"selectPolicy Min takes the smaller change", 1, 20, Behavior{
			ScaleUp:   Rules{Select: SelectMin, Policies: DefaultBehavior().ScaleUp.Policies},
			ScaleDown: Rules{Select: SelectMin, Policies: []RatePolicy{{Pods, 1, 15 * s}, {Percent, 50, 15 * s}}},
		}, []step{{0, 1, 10, 2}, {15 * s, 2, 10, 4}, {30 * s, 4, 10, 8}, {45 * s, 8, 1, 7}}},
		{"selectPolicy Disabled holds", 1, 20, Behavior{
			ScaleUp: Rules{Select: SelectDisabled}, ScaleDown: DefaultBehavior().ScaleDown,
		}, []step{{0, 3, 10, 3}}},
	} {
		h, err := NewHPA(c.min, c.max, c.b)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for i, st := range c.steps {
			if got := h.DecideRaw(st.at, st.current, st.raw); got != st.want {
				t.Errorf("%s: step %d at %v (current %d, raw %d) = %d, want %d", c.name, i, st.at, st.current, st.raw, got, st.want)
			}
		}
	}
}

func TestBehaviorValidate(t *testing.T) {
	bad := []Behavior{
		{ScaleUp: Rules{Policies: []RatePolicy{{"Jobs", 1, time.Second}}}, ScaleDown: DefaultBehavior().ScaleDown},
		{ScaleUp: Rules{}, ScaleDown: DefaultBehavior().ScaleDown},
		{ScaleUp: DefaultBehavior().ScaleUp, ScaleDown: Rules{StabilizationWindow: 2 * time.Hour, Policies: []RatePolicy{{Pods, 1, time.Second}}}},
		{ScaleUp: Rules{Policies: []RatePolicy{{Pods, 0, time.Second}}}, ScaleDown: DefaultBehavior().ScaleDown},
	}
	for i, b := range bad {
		if b.Validate() == nil {
			t.Errorf("behavior %d accepted", i)
		}
	}
	if _, err := NewHPA(0, 3, DefaultBehavior()); err == nil {
		t.Error("min 0 accepted")
	}
}

func TestSLOFormula(t *testing.T) {
	for _, c := range []struct {
		s           float64
		n, r        int
		want        float64
		description string
	}{
		{0.5, 4, 4, 4, "inside the band: hold"},
		{0.55, 4, 4, 4, "at θup: hold"},
		{1.1, 4, 4, 8, "s/θup = 2: double"},
		{1.1, 4, 2, 4, "half ready: the credit halves the ask"},
		{0.2, 8, 8, 4, "half of θdn: halve"},
		{0, 8, 8, 0, "idle: to zero (the HPA clamps to min)"},
		{0.39, 5, 5, 5, "just under θdn: floor keeps n"},
	} {
		if got := SLOFormula(Signals{SLOSaturation: c.s, Replicas: c.n, Ready: c.r}); got != c.want {
			t.Errorf("%s: SLOFormula(s=%v, n=%d, r=%d) = %v, want %v", c.description, c.s, c.n, c.r, got, c.want)
		}
	}
}

func TestQueueGuard(t *testing.T) {
	for _, c := range []struct {
		sig  Signals
		want float64
	}{
		{Signals{QueueSize: 2, Running: 16, Replicas: 3, Ready: 3}, 2},   // demand ≤ replicas
		{Signals{QueueSize: 9, Running: 16, Replicas: 4, Ready: 2}, 7},   // 9 − 2 pending
		{Signals{QueueSize: 5, Running: 0, Replicas: 4, Ready: 1}, 4},    // floored at replicas
		{Signals{QueueSize: 0, Running: 160, Replicas: 4, Ready: 4}, 10}, // running/16
	} {
		if got := QueueGuard(c.sig); got != c.want {
			t.Errorf("QueueGuard(%+v) = %v, want %v", c.sig, got, c.want)
		}
	}
}

func TestSLOSignal(t *testing.T) {
	g := SLOSignal{TTFT: time.Second, TPOT: 100 * time.Millisecond}
	if v := g.Evaluate(0); v != 0 {
		t.Fatalf("no traffic: %v, want 0", v)
	}
	for i := range 10 {
		g.Observe(10*time.Second, time.Duration(i+1)*100*time.Millisecond, 20*time.Millisecond)
	}
	// p90 of 0.1..1.0 s is 0.91 s: 0.91 of the TTFT SLO; the mean with the
	// idle 0 before it is 0.455.
	if v := g.Evaluate(15 * time.Second); math.Abs(v-0.455) > 1e-9 {
		t.Fatalf("signal %v, want 0.455", v)
	}
	// A spike is clamped at 2 before smoothing.
	g.Observe(20*time.Second, time.Minute, 0)
	g.Observe(20*time.Second, time.Minute, 0)
	if v := g.Evaluate(30 * time.Second); v > (0+0.91+2)/3+1e-9 {
		t.Fatalf("signal %v above the clamped mean", v)
	}
	// Samples leave the 1m window, values the 45s one.
	if v := g.Evaluate(200 * time.Second); v != 0 {
		t.Fatalf("old samples still count: %v", v)
	}
}

func TestNewPolicy(t *testing.T) {
	for _, n := range PolicyNames {
		p, err := NewPolicy(n, Options{Bounds: Bounds{1, 8}, Fixed: 4})
		if err != nil || p.Name() != n {
			t.Errorf("%s: %v", n, err)
		}
	}
	if _, err := NewPolicy("cpu", Options{Bounds: Bounds{1, 8}}); err == nil {
		t.Error("unknown policy accepted")
	}
	if _, err := NewPolicy("fixed", Options{}); err == nil {
		t.Error("fixed fleet of zero accepted")
	}
}
