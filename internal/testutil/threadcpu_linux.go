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
