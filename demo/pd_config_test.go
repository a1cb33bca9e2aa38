package demo

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Every --pd-decider renders a picker configuration that builds with the
// registry, its disagg-profile-handler naming the decider.
func TestPDConfigBuilds(t *testing.T) {
	for _, c := range []struct{ decider, typ string }{
		{DeciderAlways, "always-disagg-pd-decider"},
		{DeciderPrefix, "prefix-based-pd-decider"},
		{DeciderTransferCost, "transfer-cost-pd-decider"},
	} {
		for _, encode := range []bool{false, true} {
			text, err := pdConfig(c.decider, 256, 2048, 0.5, encode)
			if err != nil {
				t.Fatalf("%s: %v", c.decider, err)
			}
			cfg, err := config.Parse([]byte(text))
			if err != nil {
				t.Fatalf("%s: %v\n%s", c.decider, err, text)
			}
			if _, err := config.Build(cfg, all.Registry(), &scheduling.Handle{Services: map[string]any{}}, nil); err != nil {
				t.Fatalf("%s: %v\n%s", c.decider, err, text)
			}
			if !strings.Contains(text, "prefill: "+c.typ+"\n") || spec(t, cfg, c.typ) == nil {
				t.Errorf("%s: the handler does not decide with %s:\n%s", c.decider, c.typ, text)
			}
		}
	}
}

// The transfer-cost decider is given the KV bytes the agents move (the
// model's when --kv-bytes-per-token is 0) and the simulators' prefill rate,
// which slows with them.
func TestPDConfigTransferCostHardware(t *testing.T) {
	params := func(kv int, scale float64) (p struct {
		KVBytesPerToken        int64   `json:"kvBytesPerToken"`
		PrefillTokensPerSecond float64 `json:"prefillTokensPerSecond"`
	}) {
		text, err := pdConfig(DeciderTransferCost, 0, kv, scale, false)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Parse([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(spec(t, cfg, "transfer-cost-pd-decider").Parameters, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	given, model, slower := params(2048, 0.5), params(0, 0.5), params(2048, 0.25)
	if given.KVBytesPerToken != 2048 {
		t.Errorf("kvBytesPerToken %d, want the 2048 the agents move", given.KVBytesPerToken)
	}
	// Qwen3-0.6B: 28 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes.
	if model.KVBytesPerToken != 28*8*128*2*2 {
		t.Errorf("kvBytesPerToken %d without a size, want the model's %d", model.KVBytesPerToken, 28*8*128*2*2)
	}
	if r := given.PrefillTokensPerSecond / slower.PrefillTokensPerSecond; r < 1.99 || r > 2.01 {
		t.Errorf("prefill rate %v at time scale 0.5, %v at 0.25: want twice", given.PrefillTokensPerSecond, slower.PrefillTokensPerSecond)
	}
	for _, bad := range []float64{0, -1} {
		if _, err := pdConfig(DeciderTransferCost, 0, 2048, bad, false); err == nil {
			t.Errorf("time scale %v accepted", bad)
		}
	}
	if _, err := pdConfig("sometimes", 0, 2048, 1, false); err == nil || !strings.Contains(err.Error(), "transfer-cost") {
		t.Errorf("unknown decider: %v, want an error naming the choices", err)
	}
}

func spec(t *testing.T, cfg *config.Config, typ string) *config.PluginSpec {
	t.Helper()
	for i := range cfg.Plugins {
		if cfg.Plugins[i].Type == typ {
			return &cfg.Plugins[i]
		}
	}
	t.Fatalf("no %s plugin", typ)
	return nil
}

// kvgate up --pd takes --kv-connector when the fleet can run it and
// refuses, naming the flag, a value it cannot: an unknown connector,
// offloading with more than one prefill server, or no --pd at all.
func TestUpKVConnectorFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" accepted
	}{
		{[]string{"--pd", "1P2D", "--kv-connector", "nixlv2"}, ""},
		{[]string{"--pd", "1P2D", "--kv-connector", "offloading"}, ""},
		{[]string{"--pd", "2P2D", "--kv-connector", "shared-storage"}, ""},
		{[]string{"--pd", "2P1D", "--kv-connector", "offloading"}, "--kv-connector offloading: 2 prefill servers"},
		{[]string{"--pd", "1P1D", "--kv-connector", "mooncake"}, `--kv-connector "mooncake"`},
		{[]string{"--kv-connector", "shared-storage"}, "--kv-connector needs --pd"},
	} {
		// An accepted value meets the path checks next, which may fail here.
		o, err := ParseFlags(c.args, io.Discard)
		switch {
		case c.want == "" && ((err != nil && strings.Contains(err.Error(), "--kv-connector")) || o.KVConnector != c.args[3]):
			t.Errorf("%v: %v (connector %q), want it accepted", c.args, err, o.KVConnector)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want an error with %q", c.args, err, c.want)
		}
	}
}
