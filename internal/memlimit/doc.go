// Package memlimit turns a process's buffering budget into a Go soft memory
// limit. A byte budget (internal/bytebudget) bounds what the process holds,
// but the collector lets the heap grow to about twice the live data before
// it runs; a memory limit makes it collect earlier so that the process stays
// near its budget plus a fixed headroom for everything else.
//
// The limit is process-wide state (runtime/debug.SetMemoryLimit), so only a
// command's Main applies it; GOMEMLIMIT in the environment, the operator's
// own setting, always wins.
package memlimit
