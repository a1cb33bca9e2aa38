package demo

import (
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/kvhash"
)

// Policy names accepted by --policy: the named policies of extproc/config,
// which the cluster benchmark measures too.
const (
	PolicyPrecise    = config.PolicyPrecise
	PolicyRoundRobin = config.PolicyRoundRobin
	PolicyLoad       = config.PolicyLoad
)

// Policies lists the --policy values with what they mean.
var Policies = map[string]string{
	PolicyPrecise:       "precise prefix-cache scorer (KV events) + queue + KV-utilisation, max score",
	config.PolicyApprox: "approximate prefix-cache scorer (GIE's default profile) + queue + KV-utilisation, max score",
	PolicyLoad:          "queue + KV-utilisation scorers, max score (no cache awareness)",
	PolicyRoundRobin:    "round-robin picker (the classic load balancer)",
	config.PolicyRandom: "random picker",
}

// policyConfig is the EndpointPickerConfig of a policy. The precise scorer
// must hash as the simulators do: same tokenizer, block size and seed.
// Every picker names a fallback, which the gateway tries when the primary
// refuses the connection (a server that just died, before the picker's
// scrapes notice).
// fc, when set, puts the policy under flow control.
func policyConfig(policy, tokenizerDir, hashSeed string, fc *config.PolicyFlowControl) (string, error) {
	raw, err := config.Policy(policy, config.PolicyOptions{Tokenizer: tokenizerDir, BlockSize: kvhash.DefaultBlockSize, HashSeed: hashSeed, Fallbacks: 1, FlowControl: fc})
	return string(raw), err
}

// readsBody reports whether a policy's picker needs the request body. The
// others run on the headers-only fast path (--request-body-mode none):
// the body goes straight to the model server, never through gRPC.
func readsBody(policy string) bool {
	return policy == PolicyPrecise || policy == config.PolicyApprox
}
