package main

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

// BenchmarkTag is the filter's work per request compiled natively (parse,
// hash, encode), the baseline for the wazero numbers in gateway/wasmhost.
func BenchmarkTag(b *testing.B) {
	h, err := newHasher(defaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{16 << 10, 220 << 10} {
		body := testutil.AgentChat(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				hs, err := tag(h, openai.ChatCompletions, body)
				if err != nil {
					b.Fatal(err)
				}
				hs.Encode(func(string, string) {})
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
		})
	}
}
