// Package agent is the node agent's KV-transfer service (kvgate-agent, a
// DaemonSet on GPU nodes): it moves KV-cache blocks between the model
// servers of its node and peer agents with NIXL over UCX (nixl-cgo), and
// keeps a bounded CPU tier.
//
//   - Regions: each model server shares a memory file with the agent,
//     registered once with NIXL. The file must lie in the region directory
//     (--region-dir, default /dev/shm): the agent creates and maps the path
//     a caller names, so any other path, a ".." in it or a symlink leading
//     out is refused (PermissionDenied), as is a file that is not a regular
//     one (InvalidArgument). A block is addressed by (engine id, block hash)
//     → slot, offset slot × block_bytes; slots are reused LRU unless pinned
//     by a hold or a transfer. A server that registers its file again
//     (restarted, new engine id) retires the old engine; the old address
//     range stays mapped, blanked, for peers that may still READ it, and is
//     reused by the next region that fits (see mapping in agent.go).
//   - P/D: a prefiller stores a request's blocks under a hold (lease); the
//     decoder's agent READs them from the prefiller's agent into its own
//     server's region and notifies "<request id>:<tp size>" once the data
//     landed (vLLM NixlConnector's READ + notification), tp size being the
//     pull's PrefillSource.tp_size: how many pulls read the request, one per
//     decoder rank that pulls. The prefiller's agent frees the hold once
//     that many notifications arrived, or when the lease expires, and tells
//     the server (WatchReleases) so it frees its blocks too. A notification
//     without a count in 1..1024 is refused (logged, not counted).
//   - CPU tier: blocks a server's GPU tier evicts are copied into the
//     agent's DRAM tier (bounded, LRU) and published as vLLM KV events with
//     medium "CPU" on the server's topic; a later hit loads them back.
//   - P2P: a peer's CPU-tier blocks are pinned by PinBlocks, READ, and
//     released by the notification.
//
// Agents find each other by gRPC address (vLLM's remote_host:remote_port)
// and exchange NIXL metadata with GetMetadata (proto/kvgate/agent/v1).
//
// Ownership: one mutex guards the regions, pools, leases, peers and
// watchers; transfers run outside it (nixl.Agent has its own lock). Every
// map is bounded: live regions by maxRegions, retired ranges by maxRetired,
// leases by maxLeases, peers by maxPeers (the least recently used makes
// room), release watches by maxWatchers per engine and their queues by
// watchQueue.
//
// Idle, the agent does no work: leases expire on one timer armed for the
// earliest deadline (a heap of them), and release notifications are
// applied when NIXL's progress goroutine announces them (nixl's
// Notified), not by polling.
package agent
