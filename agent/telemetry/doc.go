// Package telemetry is the node agent's telemetry stream: it serves
// kvgate.telemetry.v1.Telemetry (proto/kvgate/telemetry/v1), sending each
// watcher a report of the node's GPUs and of the network to its peers at
// the interval the watcher asked for.
//
// The package owns the consumer side of its inputs, as small interfaces:
// GPUSource (agent/gpu implements it over NVML) and PeerSource
// (agent/netobs's tracker, adapted in package agent: the eBPF TCP flows
// and the agent's own NIXL READ timings). It imports neither NVML nor
// eBPF, so it builds without cgo.
//
// Ownership: a Server holds no state beyond its configuration; each Watch
// stream reads the sources on its own ticker; a report carries at most
// MaxReportPeers peers (the freshest).
package telemetry
