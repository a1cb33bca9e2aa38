package cluster

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/sim/engine"
)

const head = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

var (
	oraclePolicy  = Policy{Name: "oracle", Config: []byte(head + "plugins:\n- type: oracle-picker\n")}
	precisePolicy = Policy{Name: "precise", Config: []byte(head + `plugins:
- type: precise-prefix-cache-scorer
  parameters: {hashSeed: "42"}
`)}
)

func smallOpts(t *testing.T) Options {
	t.Helper()
	p, ok := engine.LookupPreset("qwen3-0.6b-h100")
	if !ok {
		t.Fatal("preset missing")
	}
	return Options{Replicas: 4, Preset: p, Seed: 3}
}

// repeated is a prompt sent twice, far enough apart for the first to have
// finished and its KV events to have reached the index.
func repeated() []workload.Request {
	segs := []workload.Segment{{Key: 99, Len: 2000}}
	return []workload.Request{
		{Arrival: 0, Segments: segs, OutputTokens: 4},
		{Arrival: 5 * time.Second, Segments: segs, OutputTokens: 4},
	}
}

// Both the oracle (true caches) and the precise scorer (KV events through
// the real kvindex) must send a repeated prompt back to the replica that
// caches it.
func TestRepeatedPromptFindsItsCache(t *testing.T) {
	for _, p := range []Policy{oraclePolicy, precisePolicy} {
		res, err := Run(context.Background(), smallOpts(t), p, repeated())
		if err != nil {
			var unknown *scheduling.UnknownTypeError
			if errors.As(err, &unknown) {
				t.Logf("%s: %v", p.Name, err)
				continue
			}
			t.Fatalf("%s: %v", p.Name, err)
		}
		a, b := res.Requests[0], res.Requests[1]
		if a.Err != "" || b.Err != "" {
			t.Fatalf("%s: failed: %q %q", p.Name, a.Err, b.Err)
		}
		if b.Replica != a.Replica || b.CachedTokens < 1984 || a.CachedTokens != 0 {
			t.Errorf("%s: replicas %d then %d, cached %d then %d", p.Name, a.Replica, b.Replica, a.CachedTokens, b.CachedTokens)
		}
		if b.TTFT >= a.TTFT {
			t.Errorf("%s: cached TTFT %v not below cold %v", p.Name, b.TTFT, a.TTFT)
		}
	}
}

// Events that have not arrived yet are invisible: with a KV-event delay
// longer than the gap between the requests, the precise scorer cannot know
// where the prompt is cached, while the oracle still does.
func TestKVEventDelayHidesCache(t *testing.T) {
	opts := smallOpts(t)
	opts.KVEventDelay = time.Hour
	misses := 0
	for seed := range uint64(8) {
		opts.Seed = seed
		res, err := Run(context.Background(), opts, precisePolicy, repeated())
		if err != nil {
			t.Skipf("precise scorer unavailable: %v", err)
		}
		if res.Requests[1].Replica != res.Requests[0].Replica {
			misses++
		}
	}
	// With 4 replicas and no information, 3 in 4 land elsewhere.
	if misses == 0 {
		t.Error("the delayed index still steered every repeat to its cache")
	}
}

func TestOptionsAndPolicyErrors(t *testing.T) {
	reqs := repeated()
	bad := smallOpts(t)
	bad.Replicas = 0
	if _, err := Run(context.Background(), bad, oraclePolicy, reqs); err == nil {
		t.Error("zero replicas accepted")
	}
	if _, err := Run(context.Background(), smallOpts(t), Policy{Name: "x", Config: []byte(head + "plugins:\n- type: no-such-plugin\n")}, reqs); err == nil {
		t.Error("unknown plugin accepted")
	}
	unsorted := []workload.Request{reqs[1], reqs[0]}
	if _, err := Run(context.Background(), smallOpts(t), oraclePolicy, unsorted); err == nil {
		t.Error("unsorted requests accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, smallOpts(t), oraclePolicy, reqs); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled run: %v", err)
	}
}

// Prompts longer than the model's context are cut, not refused.
func TestLongPromptsAreClipped(t *testing.T) {
	opts := smallOpts(t)
	reqs := []workload.Request{{Segments: []workload.Segment{{Key: 1, Len: 50000}}, OutputTokens: 3}}
	res, err := Run(context.Background(), opts, oraclePolicy, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Clipped != 1 || res.Requests[0].Err != "" || res.Requests[0].PromptTokens != engine.Qwen3_0_6B.MaxModelLen-3 {
		t.Fatalf("clipped %d, %+v", res.Clipped, res.Requests[0])
	}
}

func lookup(t *testing.T, names ...string) []engine.Preset {
	t.Helper()
	out := make([]engine.Preset, len(names))
	for i, n := range names {
		p, ok := engine.LookupPreset(n)
		if !ok {
			t.Fatalf("preset %s missing", n)
		}
		out[i] = p
	}
	return out
}

// A mixed fleet of one model runs each replica on its own hardware: every
// request records its replica's preset, and the H200's bandwidth decodes
// faster than the H100's.
func TestMixedFleet(t *testing.T) {
	presets := lookup(t, "llama-3.1-8b-h100", "llama-3.1-8b-h200", "llama-3.1-8b-h100", "llama-3.1-8b-h200")
	rr, err := config.Policy("round-robin", config.PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Requests far apart, so each runs alone and its latency is its
	// replica's speed, with distinct prompts so that no cache helps.
	var reqs []workload.Request
	for i := range 8 {
		reqs = append(reqs, workload.Request{Arrival: time.Duration(i) * 10 * time.Second,
			Segments: []workload.Segment{{Key: uint64(1000 + i), Len: 1000}}, OutputTokens: 100})
	}
	res, err := Run(context.Background(), Options{Replicas: 4, Presets: presets, Seed: 1}, Policy{Name: "rr", Config: rr}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	decode := map[string]time.Duration{}
	n := map[string]int{}
	for i, r := range res.Requests {
		if r.Err != "" || r.Replica < 0 {
			t.Fatalf("request %d: %+v", i, r)
		}
		if r.Preset != presets[r.Replica].Name {
			t.Errorf("request %d on replica %d records preset %q, want %q", i, r.Replica, r.Preset, presets[r.Replica].Name)
		}
		if want := (r.E2E - r.TTFT) / 99; r.TPOT != want || r.TPOT <= 0 {
			t.Errorf("request %d: TPOT %v, want %v", i, r.TPOT, want)
		}
		decode[r.Preset] += r.E2E - r.TTFT
		n[r.Preset]++
	}
	h100, h200 := decode["llama-3.1-8b-h100"], decode["llama-3.1-8b-h200"]
	if n["llama-3.1-8b-h100"] == 0 || n["llama-3.1-8b-h200"] == 0 {
		t.Fatalf("requests per preset %v", n)
	}
	// Decoding an 8B model is bound by memory bandwidth (4.8 vs 3.35 TB/s),
	// diluted by the per-step overhead both pay.
	ratio := float64(h200) / float64(n["llama-3.1-8b-h200"]) / (float64(h100) / float64(n["llama-3.1-8b-h100"]))
	if ratio > 0.9 {
		t.Errorf("H200 decodes in %.2f of the H100's time, want < 0.9", ratio)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"homogeneous", Options{Replicas: 2, Preset: lookup(t, "qwen3-0.6b-h100")[0]}, ""},
		{"same model, mixed hardware", Options{Replicas: 2, Presets: lookup(t, "qwen3-32b-tp2-h100", "qwen3-32b-tp2-h200")}, ""},
		{"mixed models", Options{Replicas: 2, Presets: lookup(t, "llama-3.1-8b-h100", "qwen3-32b-tp2-h100")}, "one model"},
		{"count mismatch", Options{Replicas: 3, Presets: lookup(t, "llama-3.1-8b-h100", "llama-3.1-8b-h200")}, "2 presets for 3 replicas"},
		{"SLO", Options{Replicas: 1, Preset: lookup(t, "qwen3-0.6b-h100")[0], SLO: SLO{TTFT: time.Second, Fraction: 0.5}}, ""},
		{"SLO fraction above 1", Options{Replicas: 1, Preset: lookup(t, "qwen3-0.6b-h100")[0], SLO: SLO{TTFT: time.Second, Fraction: 1.5}}, "fraction"},
		{"negative SLO fraction", Options{Replicas: 1, Preset: lookup(t, "qwen3-0.6b-h100")[0], SLO: SLO{TPOT: time.Second, Fraction: -0.1}}, "fraction"},
		{"sub-millisecond SLO", Options{Replicas: 1, Preset: lookup(t, "qwen3-0.6b-h100")[0], SLO: SLO{TPOT: time.Microsecond}}, "milliseconds"},
		{"negative SLO", Options{Replicas: 1, Preset: lookup(t, "qwen3-0.6b-h100")[0], SLO: SLO{TTFT: -time.Second}}, "milliseconds"},
	}
	for _, tc := range tests {
		err := tc.opts.Validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestSLOHeaders(t *testing.T) {
	tests := []struct {
		slo  SLO
		want map[string]string
	}{
		{SLO{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond}, map[string]string{eppwire.HeaderSLOTTFT: "500", eppwire.HeaderSLOTPOT: "50"}},
		{SLO{TTFT: 2 * time.Second}, map[string]string{eppwire.HeaderSLOTTFT: "2000"}},
		{SLO{TPOT: 20500 * time.Microsecond}, map[string]string{eppwire.HeaderSLOTPOT: "20"}},
		{SLO{}, map[string]string{}},
	}
	for _, tc := range tests {
		h := map[string]string{}
		tc.slo.setHeaders(h)
		if !maps.Equal(h, tc.want) {
			t.Errorf("%+v: headers %v, want %v", tc.slo, h, tc.want)
		}
	}
}

// The requests that carry the SLO are a seeded share of the workload, the
// same under every policy.
func TestSLOFraction(t *testing.T) {
	var reqs []workload.Request
	for i := range 1000 {
		reqs = append(reqs, workload.Request{Arrival: time.Duration(i) * 10 * time.Millisecond,
			Segments: []workload.Segment{{Key: uint64(i), Len: 20}}, OutputTokens: 2})
	}
	carried := func(slo SLO, seed uint64, p Policy) []bool {
		t.Helper()
		opts := smallOpts(t)
		opts.SLO, opts.Seed = slo, seed
		res, err := Run(context.Background(), opts, p, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if res.SLO.Active() != slo.Active() {
			t.Errorf("%+v: result SLO %+v", slo, res.SLO)
		}
		out := make([]bool, len(res.Requests))
		for i, r := range res.Requests {
			out[i] = r.SLO
		}
		return out
	}
	rr, err := config.Policy("round-robin", config.PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		slo  SLO
		want float64 // expected share
	}{
		{"no SLO", SLO{}, 0},
		{"all by default", SLO{TTFT: time.Second}, 1},
		{"all", SLO{TPOT: time.Second, Fraction: 1}, 1},
		{"a third", SLO{TTFT: time.Second, Fraction: 1.0 / 3}, 1.0 / 3},
	}
	for _, tc := range tests {
		got := carried(tc.slo, 3, oraclePolicy)
		n := 0
		for _, c := range got {
			if c {
				n++
			}
		}
		// 5 standard deviations of a binomial count.
		if sd := math.Sqrt(1000 * tc.want * (1 - tc.want)); math.Abs(float64(n)-1000*tc.want) > 5*sd {
			t.Errorf("%s: %d of 1000 carry the SLO, want ≈ %.0f", tc.name, n, 1000*tc.want)
		}
		if tc.want > 0 && tc.want < 1 {
			if !slices.Equal(got, carried(tc.slo, 3, Policy{Name: "rr", Config: rr})) {
				t.Errorf("%s: another policy saw SLOs on other requests", tc.name)
			}
			if slices.Equal(got, carried(tc.slo, 4, oraclePolicy)) {
				t.Errorf("%s: another seed chose the same requests", tc.name)
			}
		}
	}
}

// shortThenLong runs, on one H100 server, a short prompt and a long one
// arriving at the same instant, then a lone short prompt 10 s later.
func shortThenLong(t *testing.T, policy Policy) []RequestResult {
	t.Helper()
	p, ok := engine.LookupPreset("llama-3.1-8b-h100")
	if !ok {
		t.Fatal("preset missing")
	}
	reqs := []workload.Request{
		{Arrival: 0, Segments: []workload.Segment{{Key: 1, Len: 24}}, OutputTokens: 4},
		{Arrival: 0, Segments: []workload.Segment{{Key: 2, Len: 20000}}, OutputTokens: 4},
		{Arrival: 10 * time.Second, Segments: []workload.Segment{{Key: 3, Len: 24}}, OutputTokens: 4},
	}
	res, err := Run(context.Background(), Options{Replicas: 1, Preset: p, Seed: 1}, policy, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return res.Requests
}

// A short prompt with a long one routed right after it to the same
// server, at the same instant, shares its first step with the long one's
// first chunk: it is joined (its TTFT is that step's), the long one and a
// later lone prompt are not.
func TestJoined(t *testing.T) {
	rr, err := config.Policy("round-robin", config.PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := shortThenLong(t, Policy{Name: "rr", Config: rr})
	if !r[0].Joined || r[1].Joined || r[2].Joined {
		t.Fatalf("joined %v %v %v, want true false false", r[0].Joined, r[1].Joined, r[2].Joined)
	}
	if r[0].TTFT < 5*r[2].TTFT {
		t.Errorf("the joined short prompt took %v, alone %v: it should have waited for the shared step", r[0].TTFT, r[2].TTFT)
	}
}

// The same requests under prefill-join-hold: the long prompt waits in the
// picker for the short one's first token and reaches the server
// holdReachDelay later, so the short prompt's step is its own (not joined,
// about as fast as the lone one) and the long one starts after it.
func TestHeldPromptDoesNotJoin(t *testing.T) {
	cfg := []byte(`apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-join-hold
- type: round-robin-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: round-robin-picker
`)
	r := shortThenLong(t, Policy{Name: "hold", Config: cfg})
	if r[0].Joined || r[1].Joined || r[2].Joined {
		t.Fatalf("joined %v %v %v, want none", r[0].Joined, r[1].Joined, r[2].Joined)
	}
	if r[0].TTFT > 2*r[2].TTFT {
		t.Errorf("the short prompt took %v, alone %v: its step should be its own", r[0].TTFT, r[2].TTFT)
	}
	if r[1].TTFT < r[0].TTFT+holdReachDelay {
		t.Errorf("the long prompt's first token at %v, before the short one's (%v) and its way to the server", r[1].TTFT, r[0].TTFT)
	}
}

// TestOracleCacheCountsCopies: the oracle's mirror of a replica's cache
// keeps a hash while any of its blocks is stored, as the engine (like
// vLLM's block pool) can hold two blocks of one hash and removes each
// with its own event.
func TestOracleCacheCountsCopies(t *testing.T) {
	stored := &engine.BlockStored{BlockHashes: []uint64{1, 2}}
	tests := []struct {
		name   string
		events []engine.Event
		want   map[uint64]int
	}{
		{"stored once, removed", []engine.Event{stored, &engine.BlockRemoved{BlockHashes: []uint64{1}}}, map[uint64]int{2: 1}},
		{"stored twice, removed once", []engine.Event{stored, stored, &engine.BlockRemoved{BlockHashes: []uint64{1}}}, map[uint64]int{1: 1, 2: 2}},
		{"stored twice, removed twice", []engine.Event{stored, stored, &engine.BlockRemoved{BlockHashes: []uint64{1, 1}}}, map[uint64]int{2: 2}},
		{"a removal of what is not there", []engine.Event{&engine.BlockRemoved{BlockHashes: []uint64{9}}}, map[uint64]int{}},
		{"cleared", []engine.Event{stored, stored, &engine.AllBlocksCleared{}}, map[uint64]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := map[uint64]int{}
			applyEvents(cache, tt.events)
			if !maps.Equal(cache, tt.want) {
				t.Fatalf("cache %v, want %v", cache, tt.want)
			}
		})
	}
}
