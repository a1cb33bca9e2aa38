package demo

import (
	"fmt"
	"strconv"
)

// Policy names accepted by --policy.
const (
	PolicyPrecise    = "precise"
	PolicyRoundRobin = "round-robin"
	PolicyLoad       = "load"
)

// Policies lists the --policy values with what they mean.
var Policies = map[string]string{
	PolicyPrecise:    "precise prefix-cache scorer (KV events) + queue + KV-utilisation, max score",
	PolicyLoad:       "queue + KV-utilisation scorers, max score (no cache awareness)",
	PolicyRoundRobin: "round-robin picker (the classic load balancer)",
}

const configHead = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

// policyConfig is the EndpointPickerConfig of a policy. The precise scorer
// must hash as the simulators do: same tokenizer, block size and seed.
// Every picker names a fallback, which the gateway tries when the primary
// refuses the connection (a server that just died, before the picker's
// scrapes notice).
func policyConfig(policy, tokenizerDir, hashSeed string) (string, error) {
	switch policy {
	case PolicyPrecise:
		return configHead + fmt.Sprintf(`plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenizer: %s
    blockSize: 16
    hashSeed: %s
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: max-score-picker
`, strconv.Quote(tokenizerDir), strconv.Quote(hashSeed)), nil
	case PolicyLoad:
		return configHead + `plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: max-score-picker
`, nil
	case PolicyRoundRobin:
		return configHead + `plugins:
- type: round-robin-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: round-robin-picker
`, nil
	}
	return "", fmt.Errorf("unknown policy %q (want %s, %s or %s)", policy, PolicyPrecise, PolicyLoad, PolicyRoundRobin)
}

// readsBody reports whether a policy's picker needs the request body. The
// others run on the headers-only fast path (--request-body-mode none):
// the body goes straight to the model server, never through gRPC.
func readsBody(policy string) bool { return policy == PolicyPrecise }
