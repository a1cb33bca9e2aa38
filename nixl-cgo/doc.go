// Package nixl is NIXL's agent model in Go, over UCX's UCP API through cgo:
// the way NIXL's UCX backend moves KV-cache blocks between processes.
//
// An Agent owns backends (created by name with a string→string parameter
// map, as nixlAgent::createBackend), memory registrations (descriptor lists
// of DRAM; the VRAM type exists for the API's shape and is refused where
// UCX has no GPU support), its exported metadata (per UCP worker the worker
// address, per registered region the packed rkey), the remote agents whose
// metadata it loaded, prepared descriptor lists, and transfer requests.
// A transfer is a batch of ucp_get_nbx (READ) or ucp_put_nbx (WRITE) calls
// followed by ucp_ep_flush_nbx; its notification travels as a UCP active
// message sent only once the flush completed, so a peer that sees the
// notification knows the data has landed (vLLM's NixlConnector frees a
// prefill's blocks on that signal). Standalone notifications use the same
// active message.
//
// Memory rules (cgo): registered memory must not be Go heap memory; use
// AllocDRAM (anonymous mmap) or a shared file mapping (agent/kvblock.Map,
// /dev/shm) and pass descriptor addresses as uintptr.
//
// Concurrency: an Agent is safe for concurrent use; one lock serialises
// every call into UCP (workers run in UCS_THREAD_MODE_SERIALIZED), as
// NIXL's agent with thread_sync STRICT. Progress is made by the calls that
// poll (GetXferStatus, GetNotifs, Wait) and, when AgentConfig.ProgressThread
// is set, by a goroutine that sleeps on the workers' event descriptor.
//
// Backends sit behind a seam: the Agent drives a small internal interface
// (backendEngine, backendPeer, backendXfer in backend.go) with the
// operations of NIXL's backend plugin API — supported memory types,
// register/deregister memory, connection info and per-region public data
// for the local metadata, loading a peer's metadata, prepare and post a
// transfer with its notification, check status, release, standalone and
// received notifications, progress. CreateBackend looks the type name up in
// a registry fixed at build time (AvailablePlugins, PluginParams); UCX, in
// ucx.go, is the only entry, and an unknown name is refused by name. The
// Agent keeps validation, registrations, the metadata format, peers and the
// request model, so a backend over the real libnixl C API (nodes that have
// NIXL) would be one more file implementing the interface and one registry
// entry — libnixl's agent-level calls fit it with libnixl's own metadata
// blob as the connection info and libnixl resolving addresses itself; none
// is written here, as none can be tested. An agent has one backend.
package nixl
