package flowcontrol_test

import "runtime"

type runtimeMem struct{ heap uint64 }

func (m *runtimeMem) read() {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.heap = s.HeapAlloc
}
