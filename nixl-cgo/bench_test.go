package nixl

import (
	"fmt"
	"os"
	"testing"
)

// benchTLS is the transport the benchmarks use unless UCX_TLS is set.
func benchTLS(b *testing.B) {
	if os.Getenv("UCX_TLS") == "" {
		b.Setenv("UCX_TLS", "tcp")
	}
}

// benchXfer moves batch descriptors of blockBytes each per iteration and
// reports throughput in MB/s (2^20 bytes, as ucx_perftest) and the mean
// latency of one request.
func benchXfer(b *testing.B, op XferOp, blockBytes, batch int) {
	benchTLS(b)
	size := blockBytes * batch
	// The initiator progresses by polling its request; the target's
	// progress goroutine serves the transfer (UCX over TCP runs a READ's
	// remote side in software).
	spin := os.Getenv("KVGATE_BENCH_SPIN") == "1"
	init := newSideCfg(b, "init", size, nil, AgentConfig{})
	target := newSideCfg(b, "target", size, nil, AgentConfig{ProgressThread: true, ProgressSpin: spin})
	connect(b, init, target)
	var l, r []Desc
	for k := range batch {
		l = append(l, init.reg.Desc(k*blockBytes, blockBytes))
		r = append(r, target.reg.Desc(k*blockBytes, blockBytes))
	}
	req, err := init.a.CreateXferReq(op, DescList{Type: DRAM, Descs: l}, DescList{Type: DRAM, Descs: r}, "target", XferOpts{})
	if err != nil {
		b.Fatal(err)
	}
	run := func() {
		if _, err := init.a.PostXferReq(req); err != nil {
			b.Fatal(err)
		}
		if err := waitCtx(b, init.a, req); err != nil {
			b.Fatal(err)
		}
	}
	run() // connection set-up and rkey unpacking stay out of the timing
	b.ResetTimer()
	for b.Loop() {
		run()
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(size)*float64(b.N)/sec/(1<<20), "MB/s")
	b.ReportMetric(sec/float64(b.N)*1e6, "us/xfer")
	init.a.ReleaseXferReq(req)
}

// BenchmarkTransfer64MiB is one 64 MiB READ per request: the figure
// compared with `ucx_perftest -t ucp_get -s 67108864` (make bench-transfer).
func BenchmarkTransfer64MiB(b *testing.B) {
	for _, op := range []XferOp{Read, Write} {
		b.Run(op.String(), func(b *testing.B) { benchXfer(b, op, 64<<20, 1) })
	}
}

// BenchmarkTransferBlocks covers KV-block shapes: block size × batch.
func BenchmarkTransferBlocks(b *testing.B) {
	for _, blk := range []int{16 << 10, 256 << 10, 2 << 20} {
		for _, batch := range []int{1, 16, 128} {
			if blk*batch > 256<<20 {
				continue
			}
			b.Run(fmt.Sprintf("READ/block=%dKiB/batch=%d", blk>>10, batch), func(b *testing.B) { benchXfer(b, Read, blk, batch) })
		}
	}
}
