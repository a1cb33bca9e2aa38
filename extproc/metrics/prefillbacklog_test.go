package metrics

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
)

// The gauge is each endpoint's routed, unstarted prefill tokens at the
// prefill speed the latency model learned for that endpoint: two servers
// of different speeds holding the same backlog read different seconds, and
// the role and namespace labels select them as the token-aware
// ScaledObject's query does.
func TestPrefillBacklogSeconds(t *testing.T) {
	ds := endpoints.NewDatastore()
	if err := ds.Replace([]endpoints.Spec{
		{Name: "vllm-prefill-0", Address: "10.0.0.1:8000", Labels: map[string]string{endpoints.RoleLabel: "prefill", "namespace": "llm"}},
		{Name: "vllm-prefill-1", Address: "10.0.0.2:8000", Labels: map[string]string{endpoints.RoleLabel: "prefill", "namespace": "llm"}},
		{Name: "vllm-decode-0", Address: "10.0.0.3:8000", Labels: map[string]string{endpoints.RoleLabel: "decode", "namespace": "llm"}},
	}); err != nil {
		t.Fatal(err)
	}
	m := latency.New(latency.Config{})
	// Idle servers: TTFT = 20 ms + prompt / speed, the first at 10k tok/s,
	// the second at 40k tok/s.
	speeds := map[string]float64{"10.0.0.1:8000": 10_000, "10.0.0.2:8000": 40_000}
	for i := range 400 {
		p := float64(200 + (i*373)%7000)
		for addr, v := range speeds {
			m.ObserveTTFT(addr, latency.Features{Prefill: p}, time.Duration((0.02+p/v)*float64(time.Second)))
		}
	}
	for addr, v := range speeds {
		got := SecondsPerPrefillToken(m, addr)
		if math.Abs(got*v-1) > 0.05 {
			t.Errorf("%s: learned %.3g s/token, want %.3g", addr, got, 1/v)
		}
	}
	for _, name := range []string{"vllm-prefill-0", "vllm-prefill-1"} {
		ds.Get(name).Charge(0, 3000, 3000, 3100)
		ds.Get(name).Charge(1000, 1000, 2000, 2100)
	}
	done := ds.Get("vllm-prefill-0").Charge(0, 500, 500, 600)
	done.FirstToken() // past prefill: not backlog any more

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewPrefillBacklog("pool", ds, m))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != PrefillBacklogName {
			continue
		}
		for _, s := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["name"] != "pool" || l["namespace"] != "llm" {
				t.Errorf("labels %v", l)
			}
			got[l["endpoint"]+"/"+l["role"]] = s.GetGauge().GetValue()
		}
	}
	want := map[string]float64{"vllm-prefill-0/prefill": 4000 / 10_000.0, "vllm-prefill-1/prefill": 4000 / 40_000.0}
	for k, w := range want {
		if math.Abs(got[k]/w-1) > 0.05 {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	// The decode server has no backlog, and the pool's fit as its speed.
	if v, ok := got["vllm-decode-0/decode"]; !ok || v != 0 {
		t.Errorf("decode endpoint: %v %v", v, ok)
	}
	if len(got) != 3 {
		t.Errorf("series %v", got)
	}

	// A server whose TTFT does not grow with the prompt: the model learns
	// no per-token cost there, and the backlog reads 0 s rather than
	// disappearing.
	flat := latency.New(latency.Config{})
	for i := range 400 {
		flat.ObserveTTFT("10.0.0.1:8000", latency.Features{Prefill: float64(100 + (i*37)%300)}, 5*time.Millisecond)
	}
	if s := SecondsPerPrefillToken(flat, "10.0.0.1:8000"); s > 1e-7 {
		t.Logf("flat server learned %.3g s/token", s)
	}
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(NewPrefillBacklog("pool", ds, flat))
	if n, err := testutil.GatherAndCount(reg, PrefillBacklogName); err != nil || n != 3 {
		t.Errorf("flat model: %d series, %v", n, err)
	}
}
