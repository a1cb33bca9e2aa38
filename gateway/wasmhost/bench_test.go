package wasmhost_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/gateway/wasmhost"
	"github.com/kvgate/kvgate/gateway/wasmhost/wasmtest"
	"github.com/kvgate/kvgate/internal/testutil"
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
			benchFilter(b, h, testutil.AgentChat(size))
		})
	}
	// Precise mode tokenizes (chat template + BPE) and hashes with SHA-256;
	// it needs the Qwen3 tokenizer files and skips without them.
	b.Run("precise/16KB", func(b *testing.B) {
		benchFilter(b, preciseHost(b, "42"), testutil.AgentChat(16<<10))
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
