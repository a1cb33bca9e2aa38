// Package cluster is a discrete-event simulation of a pool of model servers
// behind kvgate's picker. The servers are sim/engine instances on one
// virtual clock; the picker is the production code path — a scheduler built
// from an EndpointPickerConfig by extproc/config, driven through
// extproc/director — so that in-flight accounting, the approximate prefix
// index (PreRequest) and response hooks behave as in production.
//
// The picker sees the servers as it would in a cluster: load metrics are
// snapshots published every scrape interval (and therefore stale between
// scrapes), and KV-cache events reach the KV index a configurable delay
// after the engine step that produced them.
//
// P/D fleets (Options.Roles, Options.Network, pd.go) run a disaggregated
// decision as llm-d's routing sidecar does: a prefill-only leg on the
// prefill replica, then the decode replica pulling the KV over the pair's
// network path.
//
// The whole simulation runs on one goroutine and draws randomness from one
// seeded source, so a run is a pure function of its inputs.
package cluster
