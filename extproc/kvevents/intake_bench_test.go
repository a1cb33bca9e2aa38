package kvevents

import (
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
)

// BenchmarkIntake measures the whole intake over loopback: kvgate's
// publisher connects to the central socket and sends engine-step-sized
// batches (4 BlockStored events of 32 blocks, with token ids), which are
// read, parsed, queued, decoded and applied to the index. Publishing is
// paced to stay within the queues, so nothing is dropped.
func BenchmarkIntake(b *testing.B) {
	const ep = "10.9.0.1:8000"
	idx := kvindex.New(kvindex.Config{MaxEntries: 4 << 20})
	sub, err := New(b.Context(), idx, Config{Bind: "tcp://127.0.0.1:0", Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	sub.AddEndpoint(ep, Source{})
	pub, err := kvwire.NewPublisher(b.Context(), kvwire.PublisherConfig{
		Endpoint: "tcp://" + sub.Addr().String(), Topic: kvwire.BuildTopic(ep, "m"), QueueSize: 1 << 14,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	const eventsPer = 4
	batches := make([]kvwire.EventBatch, 256)
	h := uint64(1)
	for i := range batches {
		for range eventsPer {
			hs := make([]kvwire.Hash, 32)
			for k := range hs {
				h++
				hs[k] = kvwire.Uint64Hash(h * 0x9e3779b97f4a7c15)
			}
			toks := make([]int, 32*16)
			for k := range toks {
				toks[k] = 1000 + (k*37+i)%150000
			}
			batches[i].Events = append(batches[i].Events, kvwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: 16, Medium: kvwire.MediumGPU})
		}
	}
	applied := func() int { return int(testutil.ToFloat64(sub.m.batches)) }
	// Connect and beat the slow joiner.
	deadline := time.Now().Add(10 * time.Second)
	for applied() == 0 {
		if time.Now().After(deadline) {
			b.Fatal("no batch arrived")
		}
		_ = pub.Publish(batches[0])
		time.Sleep(5 * time.Millisecond)
	}
	start := applied()
	const window = 512
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for i := range b.N {
		for i-(applied()-start) > window {
			time.Sleep(20 * time.Microsecond)
		}
		if err := pub.Publish(batches[i%len(batches)]); err != nil {
			b.Fatal(err)
		}
	}
	for applied()-start < b.N {
		if time.Now().After(deadline.Add(time.Minute)) {
			b.Fatalf("%d of %d batches applied", applied()-start, b.N)
		}
		time.Sleep(20 * time.Microsecond)
	}
	b.StopTimer()
	// On a shared machine wall time mostly measures the neighbours; the
	// process's CPU time per event (publisher and subscriber together,
	// both in this process) does not.
	cpu := cpuTime(b) - cpu0
	b.ReportMetric(float64(b.N*eventsPer)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N*eventsPer)/cpu.Seconds(), "events/cpu-s")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
