package kvindex

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// BenchmarkAdd measures ingest through Add on one goroutine: batches of 32
// blocks (a 512-token prompt) over 64 endpoints into a bounded index that
// is evicting.
func BenchmarkAdd(b *testing.B) {
	idx := New(Config{MaxEntries: 4 << 20})
	eps := endpointNames(64)
	batch := make([]uint64, 32)
	var next uint64
	blocks := 0
	for b.Loop() {
		for i := range batch {
			next++
			batch[i] = mix64(next)
		}
		if err := idx.Add(eps[next%64], TierGPU, batch); err != nil {
			b.Fatal(err)
		}
		blocks += len(batch)
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkLookup scores an 8,192-token prompt (512 blocks of 16 tokens)
// against 64 endpoints in an index of 10 million entries. In "full match"
// endpoint 0 holds the whole prompt, endpoint 1 its first half (on CPU) and
// endpoints 2-15 its first 32 blocks (a shared system prompt), and the same
// prompt repeats, so its blocks stay in the processor's caches. "cold"
// rotates over 256 such prompts, each held whole by one endpoint, so most
// reads miss the caches. "no match" stops at block 0. The rest of the
// index is other prompts' blocks spread over all endpoints.
func BenchmarkLookup(b *testing.B) {
	const (
		total = 10_000_000
		cold  = 256
	)
	idx := New(Config{MaxEntries: total + total/8})
	eps := endpointNames(64)
	prompt := func(seed uint64) []uint64 {
		p := make([]uint64, 512)
		for i := range p {
			p[i] = mix64(uint64(i) + seed<<50)
		}
		return p
	}
	hot := prompt(1)
	mustAdd(b, idx, eps[0], TierGPU, hot)
	mustAdd(b, idx, eps[1], TierCPU, hot[:256])
	for _, ep := range eps[2:16] {
		mustAdd(b, idx, ep, TierGPU, hot[:32])
	}
	colds := make([][]uint64, cold)
	for i := range colds {
		colds[i] = prompt(uint64(2 + i))
		mustAdd(b, idx, eps[i%len(eps)], TierGPU, colds[i])
	}
	filler := make([]uint64, 1024)
	for n := int(idx.Stats().Entries); n < total; n += len(filler) {
		for i := range filler {
			filler[i] = mix64(uint64(n+i) + 1<<40)
		}
		mustAdd(b, idx, eps[(n/len(filler))%64], TierGPU, filler)
	}
	b.Logf("index: %+v", idx.Stats())
	miss := prompt(1 << 13)
	out := make([]float64, len(eps))
	for _, bc := range []struct {
		name    string
		prompts [][]uint64
		want    int // blocks matched
	}{
		{"full match", [][]uint64{hot}, 512},
		{"cold", colds, 512},
		{"no match", [][]uint64{miss}, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			n := 0
			c0, ok := testutil.ThreadCPU()
			for b.Loop() {
				if got := idx.Lookup(bc.prompts[n%len(bc.prompts)], eps, out); got != bc.want {
					b.Fatalf("matched %d blocks, want %d", got, bc.want)
				}
				n++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(n), "µs/lookup")
			// The thread's CPU time leaves out other processes' turns on a
			// shared machine.
			if c1, _ := testutil.ThreadCPU(); ok {
				b.ReportMetric(float64((c1-c0).Nanoseconds())/1e3/float64(n), "cpu-µs/lookup")
			}
		})
	}
}

func mustAdd(b *testing.B, idx *Index, ep string, tier Tier, hashes []uint64) {
	if err := idx.Add(ep, tier, hashes); err != nil {
		b.Fatal(err)
	}
}

func endpointNames(n int) []string {
	eps := make([]string, n)
	for i := range eps {
		eps[i] = fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
	}
	return eps
}
