// Package benchmarks is `kvgate bench`: it replays a workload (a Mooncake
// trace, llm-d's shared-prefix shape or a multi-turn chat) against a
// simulated cluster of model servers under several routing policies and
// writes results.json, a markdown table and PNG plots.
//
// Every policy is an EndpointPickerConfig run through the production
// picker (see package cluster); the built-in ones are random, round-robin,
// load, approx (GIE's default profile), precise (KV events) and oracle, a
// reference that reads the servers' true state. RESULTS.md beside this file
// records measured runs.
package benchmarks
