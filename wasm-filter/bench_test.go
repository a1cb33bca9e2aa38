package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
)

// BenchmarkTag is the filter's work per request compiled natively (parse,
// hash, encode), the baseline for the wazero numbers in gateway/wasmhost.
func BenchmarkTag(b *testing.B) {
	h, err := newHasher(defaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{16 << 10, 220 << 10} {
		body := agentChat(size)
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

func agentChat(size int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"Qwen/Qwen3-0.6B","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	turn := `,{"role":"user","content":"` + strings.Repeat("Explain how chained block hashes identify a prompt prefix. ", 16) + `"}`
	for sb.Len()+len(turn)+2 < size {
		sb.WriteString(turn)
	}
	sb.WriteString("]}")
	return []byte(sb.String())
}
