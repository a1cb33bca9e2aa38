// Package telemetry is the picker's side of the node agents' telemetry
// stream (proto/kvgate/telemetry/v1): a Store subscribes to every agent
// (a static list, or the agent DaemonSet's pods found by the Kubernetes
// discovery of extproc/endpoints/k8s in selector mode), keeps each node's
// latest report, and answers the plugins' questions without waiting on
// any agent:
//
//   - PathBetween(from, to): the network between the nodes of two
//     endpoints ("host:port") — achievable throughput, RTT — from what
//     either node's agent measured of the other (eBPF TCP figures or NIXL
//     READ timings); the P/D transfer-cost decider and P2P source choice
//     consume it.
//   - GPUHealth(endpoint): XID errors, throttling, temperature of the
//     GPUs the endpoint runs on; the gpu-health filter and scorer consume
//     it.
//
// Endpoints resolve to nodes by the agents' reports: a GPU's endpoint list
// (pod IPs found through the GPU's processes, or the agent's
// --gpu-endpoint), else the node's own addresses (host-network and static
// fleets).
//
// Staleness: a node whose last report is older than StaleAfter is ignored
// by every query and dropped; a peer entry not updated for PeerMaxAge is
// ignored. A dead or slow agent costs only its own subscription goroutine,
// which reconnects with backoff; queries take a read lock and never block
// on the network.
//
// Ownership: the Store's mutex guards the node table and its indexes,
// written only by the subscription goroutines (one per agent) and the
// janitor. Bounded: MaxAgents subscriptions, per report at most
// maxAddresses addresses, maxGPUs GPUs with maxEndpointsPerGPU endpoints
// each, and MaxPeersPerNode peers.
package telemetry
