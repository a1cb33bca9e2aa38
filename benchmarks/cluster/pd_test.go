package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/workload"
)

const pdPolicy = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: decode-filter
- type: prefill-filter
- type: queue-scorer
- type: DECIDER
- type: disagg-profile-handler
  parameters: {deciders: {prefill: DECIDERNAME}}
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
`

func pdRun(t *testing.T, decider string, net *Network, reqs []workload.Request) *Result {
	t.Helper()
	o := smallOpts(t)
	o.Replicas, o.Roles, o.Network = 3, []string{"prefill", "decode", "decode"}, net
	name, _, _ := strings.Cut(decider, "\n")
	cfg := strings.NewReplacer("DECIDERNAME", name, "DECIDER", decider).Replace(pdPolicy)
	res, err := Run(context.Background(), o, Policy{Name: "pd", Config: []byte(cfg)}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func pdRequests(n, prompt int) []workload.Request {
	reqs := make([]workload.Request, n)
	for i := range reqs {
		reqs[i] = workload.Request{Arrival: time.Duration(i) * 200 * time.Millisecond, OutputTokens: 8,
			Segments: []workload.Segment{{Key: uint64(1000 + i), Len: prompt}}}
	}
	return reqs
}

// Every P/D request prefills on the prefill replica and decodes on a
// decode replica; its KV crosses the network, so a slower path makes its
// first token later by the transfer time.
func TestPDRequests(t *testing.T) {
	reqs := pdRequests(6, 4000)
	fast := pdRun(t, "always-disagg-pd-decider", &Network{Default: Path{BytesPerSecond: 50e9}}, reqs)
	slow := pdRun(t, "always-disagg-pd-decider", &Network{Default: Path{BytesPerSecond: 1e9, Latency: time.Millisecond}}, reqs)
	for i := range reqs {
		f, s := fast.Requests[i], slow.Requests[i]
		if f.Err != "" || s.Err != "" || f.Prefill != 0 || f.Replica == 0 || f.OutputTokens != 8 {
			t.Fatalf("request %d: fast %+v slow %+v", i, f, s)
		}
		// The model's KV (Qwen3-0.6B: 112 KiB a token) for 4000 tokens
		// takes 9 ms at 50 GB/s and 460 ms at 1 GB/s.
		if d := s.TTFT - f.TTFT; d < 400*time.Millisecond || d > 500*time.Millisecond {
			t.Errorf("request %d: the slow path adds %v to TTFT (fast %v, slow %v)", i, d, f.TTFT, s.TTFT)
		}
	}
	// The prefill replica holds no blocks once its requests decoded.
	o := smallOpts(t)
	o.Replicas, o.Roles, o.Network = 3, []string{"prefill", "decode", "decode"}, &Network{Default: Path{BytesPerSecond: 50e9}}
	cfg := strings.NewReplacer("DECIDERNAME", "always-disagg-pd-decider", "DECIDER", "always-disagg-pd-decider").Replace(pdPolicy)
	sim, err := newSim(o, Policy{Name: "pd", Config: []byte(cfg)}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := sim.reps[0].eng.Metrics(); m.KVUsage != 0 || len(sim.pd.held) != 0 || len(sim.pd.legs) != 0 {
		t.Errorf("after the run: prefill replica KV usage %v, %d held, %d legs", m.KVUsage, len(sim.pd.held), len(sim.pd.legs))
	}
	// Without a decider saying yes, nothing moves.
	local := pdRun(t, "prefix-based-pd-decider", nil, reqs)
	for i, r := range local.Requests {
		if r.Err != "" || r.Prefill != -1 || r.Replica == 0 {
			t.Fatalf("request %d prefilled remotely or on the prefill server: %+v", i, r)
		}
	}
}

func TestNetworkValidation(t *testing.T) {
	o := smallOpts(t)
	for _, n := range []*Network{
		{},
		{Default: Path{BytesPerSecond: 1e9}, Pairs: map[[2]int]Path{{1, 0}: {BytesPerSecond: 1e9}}},
		{Default: Path{BytesPerSecond: 1e9}, Pairs: map[[2]int]Path{{0, 9}: {BytesPerSecond: 1e9}}},
		{Default: Path{BytesPerSecond: 1e9, Latency: -1}},
	} {
		o.Network = n
		if err := o.Validate(); err == nil {
			t.Errorf("network %+v accepted", n)
		}
	}
	o.Network, o.Roles = nil, []string{"decode"}
	if err := o.Validate(); err == nil {
		t.Error("1 role for 4 replicas accepted")
	}
	n := &Network{Default: Path{BytesPerSecond: 1}, Pairs: map[[2]int]Path{{0, 2}: {BytesPerSecond: 2}}}
	if n.Between(2, 0).BytesPerSecond != 2 || n.Between(0, 1).BytesPerSecond != 1 {
		t.Error("Between does not find the pair both ways")
	}
}
