// Package netobs is the node agent's view of the network: per-connection
// TCP round-trip time, retransmits and bytes acked from an eBPF sockops
// program on a cgroup v2 (netobs.bpf.c, loaded from the committed bpf2go
// output), aggregated per peer address and flow class, plus the agent's own
// NIXL transfer timings for KV that moves where TCP probes cannot see it
// (RDMA). Both are exported as Prometheus metrics with bounded label sets
// and returned by Tracker.Peers for the telemetry stream.
//
//   - Classes are port ranges (Classes, ParseClass): a connecting socket is
//     classified by the port it dialled, an accepting one by its own port,
//     so ephemeral ports never decide. Only classified flows are tracked.
//   - The BPF flow map is an LRU hash of MaxFlows entries; the loader polls
//     it (Interval), turns each flow's counters into deltas, and deletes
//     closed flows once counted. Its fill is exported.
//   - Peers are bounded by MaxPeers: a new peer beyond it is counted in
//     kvgate_netobs_peers_dropped_total and not tracked; a peer with no open
//     flow and no sample for PeerTTL is forgotten.
//   - A transfer peer named by host name is looked up when first seen and
//     again once its answer is DNSTTL old (a rescheduled peer moves); while
//     a lookup fails the last good answer serves, retried every few seconds.
//     At most MaxPeers names are kept, the least recently used making room.
//
// Ownership: one mutex guards the aggregates; the poll loop is the only
// writer of the flow table and the only reader of the BPF maps. Without
// BPF permissions or kernel support, Open returns an error wrapping
// ErrUnavailable and the caller runs with transfer timings only (New).
package netobs
