package kvevents

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
)

// BenchmarkDecodeApply measures a worker's ingest on one goroutine:
// decoding realistic batches (8 requests × 32 blocks of 16 tokens stored,
// 32 blocks removed, per engine step) and applying them to an index that
// is bounded and evicting, spread over 64 endpoints.
func BenchmarkDecodeApply(b *testing.B) {
	idx := kvindex.New(kvindex.Config{MaxEntries: 4 << 20})
	sub, err := New(b.Context(), idx, Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	w := &worker{s: sub, states: map[string]*seqState{}, maxEndpoints: 1}
	eps := make([]string, 64)
	for i := range eps {
		eps[i] = fmt.Sprintf("10.0.0.%d:8000", i)
	}
	// Distinct payloads so the index keeps growing rather than re-storing.
	const nPayloads = 256
	payloads := make([][]byte, nPayloads)
	blocksPer := 0
	h := uint64(1)
	for p := range payloads {
		var batch kvwire.EventBatch
		var first []kvwire.Hash
		for r := range 8 {
			hs := make([]kvwire.Hash, 32)
			for i := range hs {
				h++
				hs[i] = kvwire.Uint64Hash(h * 0x9e3779b97f4a7c15)
			}
			if r == 0 {
				first = hs
			}
			toks := make([]int, 32*16)
			for i := range toks {
				toks[i] = 1000 + (i*37+p)%150000
			}
			batch.Events = append(batch.Events, kvwire.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: 16, Medium: kvwire.MediumGPU})
		}
		batch.Events = append(batch.Events, kvwire.BlockRemoved{BlockHashes: first, Medium: kvwire.MediumGPU})
		if payloads[p], err = kvwire.Encode(batch, kvwire.EncodingArray); err != nil {
			b.Fatal(err)
		}
		blocksPer = 9 * 32
	}
	n := 0
	for b.Loop() {
		w.apply(eps[n%len(eps)], payloads[n%nPayloads])
		n++
	}
	b.ReportMetric(float64(n*blocksPer)/b.Elapsed().Seconds(), "blocks/s")
}
