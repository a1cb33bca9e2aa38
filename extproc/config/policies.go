package config

import (
	"fmt"
	"strconv"
	"strings"
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

// PolicyNames lists the named policies, baselines first.
var PolicyNames = []string{PolicyRandom, PolicyRoundRobin, PolicyLoad, PolicyApprox, PolicyPrecise}

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
}

type weighted struct {
	typ    string
	params string
	weight int
}

// Policy returns the configuration of a named policy.
func Policy(name string, o PolicyOptions) ([]byte, error) {
	var scorers []weighted
	pick := "max-score-picker"
	load := []weighted{{typ: "queue-scorer", weight: 2}, {typ: "kv-cache-utilization-scorer", weight: 2}}
	switch name {
	case PolicyRandom:
		pick = "random-picker"
	case PolicyRoundRobin:
		pick = "round-robin-picker"
	case PolicyLoad:
		scorers = load
	case PolicyApprox:
		// GIE's default profile.
		scorers = append(load, weighted{typ: "prefix-cache-scorer", weight: 3})
	case PolicyPrecise:
		// llm-d's precise profile: GIE's default with the approximate
		// scorer replaced by the KV-event-fed one.
		var params []string
		if o.Tokenizer != "" {
			params = append(params, "tokenizer: "+strconv.Quote(o.Tokenizer))
		}
		if o.BlockSize > 0 {
			params = append(params, "blockSize: "+strconv.Itoa(o.BlockSize))
		}
		if o.HashSeed != "" {
			params = append(params, "hashSeed: "+strconv.Quote(o.HashSeed))
		}
		scorers = append(load, weighted{typ: "precise-prefix-cache-scorer", params: strings.Join(params, ", "), weight: 3})
	default:
		return nil, fmt.Errorf("unknown policy %q (want one of %s)", name, strings.Join(PolicyNames, ", "))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: %s\nkind: %s\nplugins:\n", APIVersionGIE, Kind)
	for _, s := range scorers {
		fmt.Fprintf(&b, "- type: %s\n", s.typ)
		if s.params != "" {
			fmt.Fprintf(&b, "  parameters: {%s}\n", s.params)
		}
	}
	fmt.Fprintf(&b, "- type: %s\n  parameters: {maxNumOfEndpoints: %d}\n", pick, 1+o.Fallbacks)
	b.WriteString("schedulingProfiles:\n- name: default\n  plugins:\n")
	for _, s := range scorers {
		fmt.Fprintf(&b, "  - {pluginRef: %s, weight: %d}\n", s.typ, s.weight)
	}
	fmt.Fprintf(&b, "  - {pluginRef: %s}\n", pick)
	return []byte(b.String()), nil
}
