package wasmhost_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/wasmhost"
	"github.com/kvgate/kvgate/gateway/wasmhost/wasmtest"
)

// BenchmarkFilter measures the real filter per request (headers, one body
// callback with the whole body, done) and the linear memory of its VM.
//
//	go test -run XXX -bench Filter ./gateway/wasmhost
func BenchmarkFilter(b *testing.B) {
	for _, size := range []int{16 << 10, 220 << 10} {
		b.Run(fmt.Sprintf("approximate/%dKB", size>>10), func(b *testing.B) {
			h, err := wasmhost.New(context.Background(), wasmhost.Config{
				Module: wasmtest.Filter(b), CompilationCache: wasmtest.Cache(b), MaxVMs: 1,
			})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close(context.Background())
			benchFilter(b, h, chatBody(size))
		})
	}
	// Precise mode tokenizes (chat template + BPE) and hashes with SHA-256;
	// it needs the Qwen3 tokenizer files and skips without them.
	b.Run("precise/16KB", func(b *testing.B) {
		benchFilter(b, preciseHost(b, "42"), chatBody(16<<10))
	})
}

// benchFilter runs requests with body through one VM. The precise run
// reuses one conversation, so after the first request the tokenizer's
// prefix cache serves it, as it would an agent resending its history.
func benchFilter(b *testing.B, h *wasmhost.Host, body []byte) {
	ctx := context.Background()
	vm, err := h.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Release(vm)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		s, err := vm.NewStream(ctx, [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {"content-type", "application/json"}})
		if err != nil {
			b.Fatal(err)
		}
		if act, err := s.OnRequestHeaders(ctx, false); err != nil || act != wasmhost.Pause {
			b.Fatalf("headers: %v %v", act, err)
		}
		if _, err := s.OnRequestBody(ctx, body, true); err != nil {
			b.Fatal(err)
		}
		if err := s.Done(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
	b.ReportMetric(float64(vm.MemoryBytes())/(1<<20), "MiB/VM")
}

// chatBody is a chat request of about size bytes: a system prompt and
// user turns, as agents send.
func chatBody(size int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"Qwen/Qwen3-0.6B","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	turn := `,{"role":"user","content":"` + strings.Repeat("Explain how chained block hashes identify a prompt prefix. ", 16) + `"}`
	for sb.Len()+len(turn)+2 < size {
		sb.WriteString(turn)
	}
	sb.WriteString("]}")
	return []byte(sb.String())
}
