package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Named routing policies: the EndpointPickerConfig a user would deploy for
// each, shared by the demo (`kvgate up --policy`) and the cluster
// benchmark (`kvgate bench --policies`) so that both measure the same
// thing.
const (
	PolicyRandom     = "random"
	PolicyRoundRobin = "round-robin"
	PolicyLoad       = "load"
	PolicyApprox     = "approx"
	PolicyPrecise    = "precise"
)

// PolicyOptions parameterise the named policies.
type PolicyOptions struct {
	// Tokenizer is the precise scorer's tokenizer folder; empty when every
	// request carries token ids.
	Tokenizer string
	// BlockSize and HashSeed must be the model servers' (precise only);
	// zero values take the scorer's defaults.
	BlockSize int
	HashSeed  string
	// Fallbacks is how many fallback endpoints the picker names after the
	// primary, for the proxy to try when the primary refuses connections.
	Fallbacks int
	// FlowControl, when set, runs the policy under llm-d's flow-control
	// layer (featureGates: [flowControl]).
	FlowControl *PolicyFlowControl
}

// PolicyFlowControl is the flow-control layer a named policy runs under:
// a concurrency-detector that saturates at MaxConcurrency in-flight
// requests per server (the picker's own count, so that a completion frees
// room at once rather than at the next scrape), and, with
// HoldbackMinCeiling, a priority-holdback-policy that stops the lowest
// priority band at that fraction of saturation, leaving the rest for the
// bands above it. The same layout as benchmarks/flowcontrol/mixed-fc.yaml.
type PolicyFlowControl struct {
	MaxConcurrency int
	// HoldbackMinCeiling in [0, 1): 0 gives strict priority only (no
	// usage-limit policy).
	HoldbackMinCeiling float64
	// RequestTTL is defaultRequestTTL: how long a request may wait in the
	// queue (0: llm-d's default).
	RequestTTL time.Duration
}

// policyScorer is one weighted scorer of a named policy.
type policyScorer struct {
	Type   string
	Weight float64
	// Parameters, when set, gives the plugin's parameters for the options;
	// a nil result leaves them out, so the plugin takes its defaults.
	Parameters func(PolicyOptions) any
}

// policyPlugin is a plugin of a named policy that is not a scorer: a data
// producer or an admitter (bound by capability, listed under plugins only)
// or a filter (InProfile: it runs in the profile, before the scorers).
type policyPlugin struct {
	Type       string
	InProfile  bool
	Parameters func(PolicyOptions) any
}

// namedPolicy is a named policy: scorers feeding one picker, with the
// plugins that prepare or gate the decision.
type namedPolicy struct {
	Name    string
	Picker  string
	Plugins []policyPlugin
	Scorers []policyScorer
}

// loadScorers balance queue length and KV-cache use; every cache-aware
// policy adds its prefix scorer to them.
var loadScorers = []policyScorer{{Type: "queue-scorer", Weight: 2}, {Type: "kv-cache-utilization-scorer", Weight: 2}}

// policies is the table of named policies, baselines first (PolicyNames
// keeps its order).
var policies = []namedPolicy{
	{Name: PolicyRandom, Picker: "random-picker"},
	{Name: PolicyRoundRobin, Picker: "round-robin-picker"},
	{Name: PolicyLoad, Picker: "max-score-picker", Scorers: loadScorers},
	// GIE's default profile.
	{Name: PolicyApprox, Picker: "max-score-picker", Scorers: withScorer(loadScorers,
		policyScorer{Type: "prefix-cache-scorer", Weight: 3})},
	// kvgate's recommended profile: the live load model and the online
	// latency model. The precise prefix match (KV events, plus the blocks
	// of requests still in prefill) tells each candidate's uncached work;
	// the predictor turns it and the live backlog into TTFT and TPOT; the
	// latency scorer picks the fastest, or, for requests with an SLO, the
	// SLO filter and admitter keep them where they can meet it. A long
	// prompt waits in the picker while a prompt ahead of it on its server
	// is in prefill (prefill-join-hold), so that its first chunk does not
	// fill that prompt's last step. Scraped
	// queue and KV gauges play no part: between two scrapes every decision
	// would see the same snapshot and herd under a burst.
	{Name: PolicyPrecise, Picker: "max-score-picker",
		Plugins: []policyPlugin{
			{Type: "precise-prefix-cache-scorer", Parameters: preciseParameters},
			{Type: "prefill-join-hold"},
			{Type: "predicted-latency-producer", Parameters: fixed(map[string]any{"streamingMode": true, "prefillJoinHold": "prefill-join-hold"})},
			{Type: "latency-slo-admitter"},
			{Type: "slo-headroom-tier-filter", InProfile: true},
		},
		Scorers: []policyScorer{{Type: "latency-scorer", Weight: 1, Parameters: fixed(map[string]any{"ttftWeight": 1, "tpotWeight": 0})}},
	},
}

// fixed is parameters that do not depend on the options.
func fixed(v any) func(PolicyOptions) any { return func(PolicyOptions) any { return v } }

// withScorer copies base before appending, so that policies never share a
// backing array.
func withScorer(base []policyScorer, s policyScorer) []policyScorer {
	return append(append([]policyScorer(nil), base...), s)
}

// PolicyNames lists the named policies, baselines first.
var PolicyNames = func() []string {
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	return names
}()

// precisePrefixParameters are the precise scorer's parameters a policy
// sets; the scorer's own defaults fill the rest.
type precisePrefixParameters struct {
	Tokenizer           string `json:"tokenizer,omitempty"`
	BlockSize           int    `json:"blockSize,omitempty"`
	HashSeed            string `json:"hashSeed,omitempty"`
	SpeculativeIndexing bool   `json:"speculativeIndexing"`
}

func preciseParameters(o PolicyOptions) any {
	return precisePrefixParameters{Tokenizer: o.Tokenizer, BlockSize: max(o.BlockSize, 0), HashSeed: o.HashSeed, SpeculativeIndexing: true}
}

// parameters marshals a plugin's parameters for the options; nil when the
// plugin takes its defaults.
func parameters(typ string, f func(PolicyOptions) any, o PolicyOptions) (json.RawMessage, error) {
	if f == nil {
		return nil, nil
	}
	v := f(o)
	if v == nil {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s parameters: %w", typ, err)
	}
	return raw, nil
}

// pickerParameters bound the endpoints a picker names: the primary and
// its fallbacks.
type pickerParameters struct {
	MaxNumOfEndpoints int `json:"maxNumOfEndpoints"`
}

// Policy returns the configuration of a named policy.
func Policy(name string, o PolicyOptions) ([]byte, error) {
	for _, p := range policies {
		if p.Name == name {
			c, err := p.config(o)
			if err != nil {
				return nil, fmt.Errorf("policy %s: %w", name, err)
			}
			return yaml.Marshal(c)
		}
	}
	return nil, fmt.Errorf("unknown policy %q (want one of %s)", name, strings.Join(PolicyNames, ", "))
}

// config is the policy's configuration: each scorer and the picker as a
// plugin, all of them in the one default profile.
func (p namedPolicy) config(o PolicyOptions) (*Config, error) {
	c := &Config{APIVersion: APIVersionGIE, Kind: Kind}
	profile := ProfileSpec{Name: "default"}
	for _, pl := range p.Plugins {
		raw, err := parameters(pl.Type, pl.Parameters, o)
		if err != nil {
			return nil, err
		}
		c.Plugins = append(c.Plugins, PluginSpec{Type: pl.Type, Parameters: raw})
		if pl.InProfile {
			profile.Plugins = append(profile.Plugins, PluginRef{PluginRef: pl.Type})
		}
	}
	for _, s := range p.Scorers {
		raw, err := parameters(s.Type, s.Parameters, o)
		if err != nil {
			return nil, err
		}
		c.Plugins = append(c.Plugins, PluginSpec{Type: s.Type, Parameters: raw})
		profile.Plugins = append(profile.Plugins, PluginRef{PluginRef: s.Type, Weight: &s.Weight})
	}
	raw, err := json.Marshal(pickerParameters{MaxNumOfEndpoints: 1 + o.Fallbacks})
	if err != nil {
		return nil, err
	}
	c.Plugins = append(c.Plugins, PluginSpec{Type: p.Picker, Parameters: raw})
	profile.Plugins = append(profile.Plugins, PluginRef{PluginRef: p.Picker})
	c.SchedulingProfiles = []ProfileSpec{profile}
	if o.FlowControl != nil {
		if err := o.FlowControl.apply(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// apply adds the flow-control gate, detector, usage-limit policy and
// section to c.
func (f *PolicyFlowControl) apply(c *Config) error {
	if f.MaxConcurrency < 1 {
		return fmt.Errorf("flow control: MaxConcurrency %d must be positive", f.MaxConcurrency)
	}
	if f.HoldbackMinCeiling < 0 || f.HoldbackMinCeiling >= 1 {
		return fmt.Errorf("flow control: HoldbackMinCeiling %v must be in [0, 1)", f.HoldbackMinCeiling)
	}
	const detector, holdback = "concurrency-detector", "priority-holdback-policy"
	raw, err := json.Marshal(map[string]int{"maxConcurrency": f.MaxConcurrency})
	if err != nil {
		return err
	}
	c.FeatureGates = append(c.FeatureGates, FlowControlGate)
	c.Plugins = append(c.Plugins, PluginSpec{Type: detector, Parameters: raw})
	section := map[string]any{"saturationDetector": map[string]string{"pluginRef": detector}}
	if f.HoldbackMinCeiling > 0 {
		if raw, err = json.Marshal(map[string]float64{"minCeiling": f.HoldbackMinCeiling}); err != nil {
			return err
		}
		c.Plugins = append(c.Plugins, PluginSpec{Type: holdback, Parameters: raw})
		section["usageLimitPolicyPluginRef"] = holdback
	}
	if f.RequestTTL > 0 {
		section["defaultRequestTTL"] = f.RequestTTL.String()
	}
	c.FlowControl, err = json.Marshal(section)
	return err
}
