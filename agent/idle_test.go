package agent

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// BenchmarkIdleAgent measures the CPU time an idle agent that holds no or
// maxLeases leases (none near its deadline) uses, the whole test process
// counted, in CPU milliseconds per second of idling: what the agent's own
// bookkeeping costs a node when no transfer runs. Run it with a fixed
// count, e.g. -bench IdleAgent -benchtime 200x.
func BenchmarkIdleAgent(b *testing.B) {
	for _, leases := range []int{0, maxLeases} {
		b.Run(fmt.Sprint(leases, "leases"), func(b *testing.B) { idle(b, leases) })
	}
}

func idle(b *testing.B, leases int) {
	n := newNode(b, "idle", 0)
	n.region(b, "E", blockBytes, 4, "")
	for i := range leases {
		if _, err := n.a.StoreBlocks(b.Context(), &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{1},
			Hold: &agentv1.Hold{RequestId: fmt.Sprint("r", i), LeaseMs: 1 << 31}}); err != nil {
			b.Fatal(err)
		}
	}
	var r0, r1 syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r0); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	idle := time.Since(start)
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r1); err != nil {
		b.Fatal(err)
	}
	cpu := time.Duration(r1.Utime.Nano() - r0.Utime.Nano() + r1.Stime.Nano() - r0.Stime.Nano())
	b.ReportMetric(float64(cpu.Milliseconds())/idle.Seconds(), "cpu-ms/s")
}

// TestIdleAgentSleeps: an agent that holds leases, none of them due, and
// receives no notification takes no lock: it sleeps until the earliest
// deadline or the next notification. Before, a 2 ms ticker polled for
// notifications and scanned every lease under the agent's lock (a whole
// core at maxLeases, see BenchmarkIdleAgent). The test holds that lock for
// a while and asks the mutex profile whether anyone waited for it.
func TestIdleAgentSleeps(t *testing.T) {
	n := newNode(t, "n", 0)
	n.region(t, "E", blockBytes, 4, "")
	for i := range 3 {
		if _, err := n.a.StoreBlocks(t.Context(), &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{uint64(i)},
			Hold: &agentv1.Hold{RequestId: fmt.Sprint("r", i), LeaseMs: 3600_000}}); err != nil {
			t.Fatal(err)
		}
	}
	defer runtime.SetMutexProfileFraction(runtime.SetMutexProfileFraction(1))
	n.a.mu.Lock()
	// Long enough for the old ticker to have fired many times; with
	// nothing due, any length passes.
	time.Sleep(100 * time.Millisecond)
	n.a.mu.Unlock()
	var prof bytes.Buffer
	if err := pprof.Lookup("mutex").WriteTo(&prof, 1); err != nil {
		t.Fatal(err)
	}
	// sync.Mutex contention is recorded at the unlock that ended it, under
	// the unlocker's stack: this test's.
	if strings.Contains(prof.String(), "TestIdleAgentSleeps") {
		t.Fatalf("something waited for the idle agent's lock:\n%s", prof.String())
	}
}
