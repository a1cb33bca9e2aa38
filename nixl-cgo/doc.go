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
// The UCX backend is the only one here, and the Agent calls it directly:
// its surface (register/deregister, workerAddrs, newConn → conn.post,
// xfer.poll, conn.notify, progress, notifs) is what a backend over the real
// libnixl C API would implement on nodes that have NIXL; the Agent's
// validation, metadata and request model stay as they are.
package nixl
