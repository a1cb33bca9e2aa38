// Package telemetry is the node agent's telemetry stream: it serves
// kvgate.telemetry.v1.Telemetry (proto/kvgate/telemetry/v1), sending each
// watcher a report of the node's GPUs and of the network to its peers at
// the interval the watcher asked for.
//
// The package owns the consumer side of its inputs, as small interfaces:
// GPUSource (agent/gpu implements it over NVML) and PeerSource (the eBPF
// tracker, and TransferTracker, which turns the agent's own NIXL READ
// timings into the same per-peer figures). It imports neither NVML nor
// eBPF, so it builds without cgo.
//
// Ownership: TransferTracker's map is bounded (MaxPeers, least recently
// updated evicted) and guarded by its mutex; a Server holds no state of its
// own beyond its configuration, each Watch stream reads the sources on its
// own ticker.
package telemetry
