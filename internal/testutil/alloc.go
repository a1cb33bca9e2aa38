package testutil

import (
	"runtime"
	"weak"
)

// AllocatedPerByte is the heap bytes f allocates per byte of a payload of
// payloadLen bytes, averaged over a few runs: the heap's counters, not
// time, so tests can bound how much decoding a message may cost. Nothing
// else should allocate meanwhile (no parallel tests).
func AllocatedPerByte(payloadLen int, f func()) float64 {
	const runs = 4
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / runs / float64(payloadLen)
}

// Collected reports whether w's value is gone after the collections that
// empty a sync.Pool (the first moves a pool's contents to its victim
// cache, the second drops them): a test's check that nothing but a pool
// keeps a buffer alive. Nothing should take from the pool meanwhile (no
// parallel tests).
func Collected[T any](w weak.Pointer[T]) bool {
	runtime.GC()
	runtime.GC()
	return w.Value() == nil
}
