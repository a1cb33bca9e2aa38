package async

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestLocalConcurrencyAndComposite(t *testing.T) {
	ctx := context.Background()
	a, b := NewLocalConcurrency(2), NewLocalConcurrency(1)
	c := Composite{a, b}
	if got := c.Budget(ctx); got != 1 {
		t.Fatalf("idle budget %v", got)
	}
	ok, rel, _ := c.Apply(ctx, nil)
	if !ok || a.InFlight() != 1 || b.InFlight() != 1 {
		t.Fatalf("first admission: ok %v, in flight %d %d", ok, a.InFlight(), b.InFlight())
	}
	if got := c.Budget(ctx); got != 0 {
		t.Fatalf("budget with b full: %v", got)
	}
	// b refuses: what a reserved is given back.
	if ok, _, _ := c.Apply(ctx, nil); ok || a.InFlight() != 1 {
		t.Fatalf("second admission ok %v, a in flight %d", ok, a.InFlight())
	}
	rel()
	rel() // a second call is a no-op
	if a.InFlight() != 0 || b.InFlight() != 0 {
		t.Fatalf("after release: %d %d", a.InFlight(), b.InFlight())
	}
}

func TestMetricGate(t *testing.T) {
	ctx := context.Background()
	val := func(v float64, err error) Source {
		return SourceFunc(func(context.Context) (float64, error) { return v, err })
	}
	for _, tc := range []struct {
		name string
		src  Source
		thr  float64
		fb   float64
		want float64
	}{
		{"open", val(0.9, nil), 0.2, 0, 0.7},
		{"at threshold", val(0.2, nil), 0.2, 0, 0},
		{"below", val(0.1, nil), 0.2, 0, 0},
		{"clamped", val(3, nil), 0, 0, 1},
		{"error falls back", val(0, errors.New("down")), 0.2, 0.4, 0.4},
		{"NaN falls back", val(math.NaN(), nil), 0.2, 0, 0},
	} {
		g := &MetricGate{Source: tc.src, Threshold: tc.thr, Fallback: tc.fb}
		if got := g.Budget(ctx); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: budget %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Saturation gates work in saturation space: closed at s ≥ threshold,
// else (1−s) − (1−threshold).
func TestPickerSaturationInProcess(t *testing.T) {
	sat := 0.0
	f := &Factory{PoolSaturation: func(context.Context) (float64, error) { return sat, nil }}
	g, err := f.New(GateConfig{GateType: GatePickerSaturation, GateParams: map[string]any{"threshold": "0.8"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ sat, want float64 }{{0, 0.8}, {0.5, 0.3}, {0.8, 0}, {1.3, 0}} {
		sat = tc.sat
		if got := g.Budget(context.Background()); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("saturation %v: budget %v, want %v", tc.sat, got, tc.want)
		}
	}
}

// picker-saturation scrapes the picker's flow-control gauge, stage
// "effective", in the picker's exposition format.
func TestPickerSaturationScrape(t *testing.T) {
	page := `# HELP llm_d_epp_flow_control_pool_saturation Pool saturation.
# TYPE llm_d_epp_flow_control_pool_saturation gauge
llm_d_epp_flow_control_pool_saturation{inference_pool="kvgate",stage="decode"} 0.2
llm_d_epp_flow_control_pool_saturation{inference_pool="kvgate",stage="effective"} 0.5
llm_d_epp_flow_control_pool_saturation{inference_pool="other",stage="effective"} 0.99
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, page)
	}))
	defer srv.Close()
	f := &Factory{}
	g, err := f.New(GateConfig{GateType: GatePickerSaturation, GateParams: map[string]any{"url": srv.URL, "pool": "kvgate"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Budget(context.Background()); math.Abs(got-0.3) > 1e-9 {
		t.Fatalf("budget %v, want 0.3 (1 - 0.5 - (1 - 0.8))", got)
	}
	// Without the gauge (flow control off) the fallback applies: saturation
	// 0 unless configured.
	page = "# TYPE other gauge\nother 1\n"
	if got := g.Budget(context.Background()); got != 1 {
		t.Fatalf("budget without the gauge %v, want 1 (fallback saturation 0)", got)
	}
	g, _ = f.New(GateConfig{GateType: GatePickerSaturation, GateParams: map[string]any{"url": srv.URL, "fallback": 1}})
	if got := g.Budget(context.Background()); got != 0 {
		t.Fatalf("budget without the gauge %v, want 0 (fallback saturation 1)", got)
	}
}

func TestFactoryRefuses(t *testing.T) {
	f := &Factory{}
	withProm := &Factory{PrometheusURL: "http://127.0.0.1:1"}
	for _, tc := range []struct {
		f    *Factory
		cfg  GateConfig
		want string
	}{
		{f, GateConfig{GateType: "nope"}, "unknown gate_type"},
		{f, GateConfig{GateType: "redis", GateParams: map[string]any{"address": "x"}}, "not supported"},
		{f, GateConfig{GateType: GateLocalMaxConcurrency}, "limit must be a positive"},
		{f, GateConfig{GateType: GateLocalMaxConcurrency, GateParams: map[string]any{"limit": "2.5"}}, "integer"},
		{f, GateConfig{GateType: GateLocalMaxConcurrency, GateParams: map[string]any{"limit": 2, "gating_mode": "blocking"}}, "gating_mode"},
		{f, GateConfig{GateType: GateLocalMaxConcurrency, GateParams: map[string]any{"limit": 2, "limt": 3}}, "unknown gate_params limt"},
		{f, GateConfig{GateType: GatePrometheusSaturation, GateParams: map[string]any{"pool": "p"}}, "--prometheus-url"},
		{withProm, GateConfig{GateType: GatePrometheusSaturation}, "gate_params.pool"},
		{withProm, GateConfig{GateType: GatePrometheusSaturation, GateParams: map[string]any{"pool": "p", "threshold": 2}}, "threshold must be in [0, 1]"},
		{withProm, GateConfig{GateType: GatePrometheusBudget, GateParams: map[string]any{"pool": "p", "baseline": "1"}}, "baseline"},
		{withProm, GateConfig{GateType: GatePrometheusBudget, GateParams: map[string]any{"pool": "p", "max_concurrency": 0}}, "max_concurrency"},
		{withProm, GateConfig{GateType: GatePrometheusQuery}, "gate_params.query"},
		{f, GateConfig{GateType: GatePickerSaturation}, "gate_params.url"},
		{f, GateConfig{GateType: GateComposite}, "gates"},
		{f, GateConfig{GateType: GateComposite, GateParams: map[string]any{"gates": `[{"gate_type":"nope"}]`}}, "composite gate 0 (nope)"},
		{f, GateConfig{GateType: GateConstant, GateParams: map[string]any{"x": 1}}, "unknown gate_params x"},
	} {
		_, err := tc.f.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// Composite's gates come as a JSON string (llm-d-async's README) or as
// structured JSON.
func TestFactoryComposite(t *testing.T) {
	f := &Factory{}
	for _, gates := range []any{
		`[{"gate_type":"local-max-concurrency","gate_params":{"limit":"1"}},{"gate_type":"constant"}]`,
		[]any{map[string]any{"gate_type": "local-max-concurrency", "gate_params": map[string]any{"limit": 1.0}}, map[string]any{"gate_type": "constant"}},
	} {
		g, err := f.New(GateConfig{GateType: GateComposite, GateParams: map[string]any{"gates": gates}})
		if err != nil {
			t.Fatal(err)
		}
		ok1, rel, _ := g.Apply(context.Background(), nil)
		ok2, _, _ := g.Apply(context.Background(), nil)
		if !ok1 || ok2 {
			t.Fatalf("limit 1: admissions %v %v", ok1, ok2)
		}
		rel()
	}
}

// memQueue is an in-memory Queue ordered by insertion.
type memQueue struct {
	msgs                        []*Envelope
	dispatched, expired, requed []string
	releases                    []func()
}

func (q *memQueue) Pop(context.Context) (*Envelope, error) {
	if len(q.msgs) == 0 {
		return nil, nil
	}
	m := q.msgs[0]
	q.msgs = q.msgs[1:]
	return m, nil
}
func (q *memQueue) Requeue(_ context.Context, m *Envelope) error {
	q.requed = append(q.requed, m.Request.ID)
	return nil
}
func (q *memQueue) Expire(_ context.Context, m *Envelope) {
	q.expired = append(q.expired, m.Request.ID)
}
func (q *memQueue) Dispatch(_ context.Context, m *Envelope, rel func()) error {
	q.dispatched = append(q.dispatched, m.Request.ID)
	q.releases = append(q.releases, rel)
	return nil
}

func TestPoll(t *testing.T) {
	now := time.Unix(1000, 0)
	q := &memQueue{}
	for i, d := range []int64{999, 2000, 2000, 2000, 2000, 2000} {
		q.msgs = append(q.msgs, &Envelope{Request: Request{ID: fmt.Sprint(i), Deadline: d}})
	}
	g := NewLocalConcurrency(4)
	g.Apply(context.Background(), nil) // one in flight: budget 3/4
	// floor(4 × 0.75) = 3 pops: one expired, two dispatched.
	r, err := Poll(context.Background(), now, g, 4, q)
	if err != nil {
		t.Fatal(err)
	}
	if r.Take != 3 || r.Expired != 1 || r.Dispatched != 2 || fmt.Sprint(q.dispatched) != "[1 2]" || fmt.Sprint(q.expired) != "[0]" {
		t.Fatalf("round %+v dispatched %v expired %v", r, q.dispatched, q.expired)
	}
	// Budget 1/4 → floor(4 × 0.25) = 1 pop, which the gate admits; with the
	// gate full the next round takes none and the rest stays queued.
	r, _ = Poll(context.Background(), now, g, 4, q)
	if r.Take != 1 || r.Dispatched != 1 {
		t.Fatalf("second round %+v", r)
	}
	r, _ = Poll(context.Background(), now, g, 4, q)
	if r.Take != 0 || r.Popped != 0 || len(q.msgs) != 2 {
		t.Fatalf("closed round %+v, %d left", r, len(q.msgs))
	}
	// A gate that admits fewer than the budget promised: refused ones go back.
	q.releases[0]()
	r, _ = Poll(context.Background(), now, Composite{openGate{}, g}, 8, q)
	if r.Dispatched != 1 || r.Refused != 1 || fmt.Sprint(q.requed) != "[5]" {
		t.Fatalf("refusal round %+v requeued %v", r, q.requed)
	}
}

func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		retries        int
		toDeadline, ra time.Duration
		rnd            float64
		lo, hi         time.Duration
	}{
		{1, time.Hour, 0, 0, 2 * time.Second, 4 * time.Second},
		{1, time.Hour, 0, 0.999, 2 * time.Second, 4 * time.Second},
		{3, time.Hour, 0, 0.5, 8 * time.Second, 16 * time.Second},
		{10, time.Hour, 0, 0.5, 30 * time.Second, 60 * time.Second},
		{10, 10 * time.Second, 0, 0.5, 5 * time.Second, 10 * time.Second},
		// Retry-After beyond the backoff, held to half the time left.
		{1, time.Hour, 30 * time.Second, 0, 30 * time.Second, 30 * time.Second},
		{1, 20 * time.Second, 30 * time.Second, 0, 10 * time.Second, 10 * time.Second},
	} {
		d, ok := (Backoff{}).Delay(tc.retries, tc.toDeadline, tc.ra, func() float64 { return tc.rnd })
		if !ok || d < tc.lo || d > tc.hi {
			t.Errorf("%+v: %v %v, want in [%v, %v]", tc, d, ok, tc.lo, tc.hi)
		}
	}
	if _, ok := (Backoff{}).Delay(1, 500*time.Millisecond, 0, func() float64 { return 0 }); ok {
		t.Fatal("a retry with under a second left")
	}
}
