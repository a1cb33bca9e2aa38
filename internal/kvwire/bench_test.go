package kvwire

import "testing"

// realisticBatch is one engine step's events from a busy server: 8
// requests each storing 32 blocks of 16 tokens (a 512-token prompt), and
// one eviction of 32 blocks.
func realisticBatch() EventBatch {
	var b EventBatch
	h := uint64(1 << 60)
	for range 8 {
		hs := make([]Hash, 32)
		for i := range hs {
			h += 0x9e3779b97f4a7c15
			hs[i] = Uint64Hash(h)
		}
		toks := make([]int, 32*16)
		for i := range toks {
			toks[i] = 1000 + i*37%150000
		}
		parent := Uint64Hash(h ^ 1)
		b.Events = append(b.Events, BlockStored{BlockHashes: hs, ParentBlockHash: &parent, TokenIDs: toks, BlockSize: 16, Medium: MediumGPU})
	}
	b.Events = append(b.Events, BlockRemoved{BlockHashes: b.Events[0].(BlockStored).BlockHashes, Medium: MediumGPU})
	return b
}

// BenchmarkDecode reports block events decoded per second on one
// goroutine, in both encodings.
func BenchmarkDecode(b *testing.B) {
	batch := realisticBatch()
	blocks := 0
	for _, ev := range batch.Events {
		switch ev := ev.(type) {
		case BlockStored:
			blocks += len(ev.BlockHashes)
		case BlockRemoved:
			blocks += len(ev.BlockHashes)
		}
	}
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		b.Run(enc.String(), func(b *testing.B) {
			payload, err := Encode(batch, enc)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, _, err := Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	batch := realisticBatch()
	for b.Loop() {
		if _, err := Encode(batch, EncodingArray); err != nil {
			b.Fatal(err)
		}
	}
}
