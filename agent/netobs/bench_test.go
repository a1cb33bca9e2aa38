package netobs

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkAgentCPU1000Flows measures the agent's own CPU cost with 1,000
// concurrent classified TCP flows on loopback (2,000 tracked sockets: both
// ends are on this host), each exchanging a 64-byte ping every 100 ms:
//   - poll-cpu-ns/op is the CPU time of one poll of the flow map (read,
//     account, delete closed), ns/op its wall time;
//   - bpf-ns/event is the sockops program's mean run time per callback
//     (kernel.bpf_stats_enabled), bpf-events/s their rate;
//   - agent-cpu-% is the BPF time per second plus one poll per second (the
//     default interval), as a share of one core.
func BenchmarkAgentCPU1000Flows(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("loading eBPF programs needs root")
	}
	const flows = 1000
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	tr, err := New(Config{Classes: []Class{{Name: "bench", Ranges: []PortRange{{port, port}}}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := tr.Attach(); err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("bpf stats: %v", err)
	}
	defer stats.Close()

	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); ln.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); _, _ = io.Copy(c, c) })
		}
	})
	conns := make([]net.Conn, flows)
	for i := range conns {
		if conns[i], err = net.Dial("tcp4", ln.Addr().String()); err != nil {
			b.Fatal(err)
		}
	}
	for i, c := range conns {
		wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 64)
			// Spread the flows' pings over the period.
			time.Sleep(time.Duration(i) * 100 * time.Millisecond / flows)
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // every flow established and pinging
	tr.poll(time.Now())
	before, err := tr.bpf.runStats()
	if err != nil {
		b.Fatal(err)
	}
	// The polls' own CPU time: on a busy machine wall time per poll also
	// counts waiting for a core.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU(b)
	start := time.Now()
	for b.Loop() {
		tr.poll(time.Now())
	}
	wall := time.Since(start)
	pollCPU := float64((threadCPU(b) - cpu0).Nanoseconds()) / float64(b.N)
	after, err := tr.bpf.runStats()
	if err != nil {
		b.Fatal(err)
	}
	if tr.counts.mapEntries < 2*flows {
		b.Fatalf("%d flows in the map, want %d", tr.counts.mapEntries, 2*flows)
	}
	runs := after.RunCount - before.RunCount
	bpfTime := after.Runtime - before.Runtime
	b.ReportMetric(pollCPU, "poll-cpu-ns/op")
	if runs > 0 {
		b.ReportMetric(float64(bpfTime.Nanoseconds())/float64(runs), "bpf-ns/event")
	}
	b.ReportMetric(float64(runs)/wall.Seconds(), "bpf-events/s")
	b.ReportMetric(100*(bpfTime.Seconds()/wall.Seconds()+pollCPU/float64(time.Second)), "agent-cpu-%")
	b.ReportMetric(float64(tr.counts.mapEntries), "tracked-sockets")
}

// threadCPU is the calling thread's user+system CPU time.
func threadCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
