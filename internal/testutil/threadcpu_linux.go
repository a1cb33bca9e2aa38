package testutil

import (
	"syscall"
	"time"
	"unsafe"
)

// ThreadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), for
// benchmarks on a machine shared with other work: what an operation costs,
// excluding the time other processes held the CPU. Lock the goroutine to
// its thread (runtime.LockOSThread) around the readings.
func ThreadCPU() (time.Duration, bool) {
	const clockThreadCPUTime = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// ThreadSwitches is how many times the calling thread has left the CPU
// (voluntary and involuntary context switches, getrusage RUSAGE_THREAD):
// an operation between two equal readings ran without another process
// taking its core, and so without finding caches that process emptied.
func ThreadSwitches() (int64, bool) {
	const rusageThread = 1
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return ru.Nvcsw + ru.Nivcsw, true
}
