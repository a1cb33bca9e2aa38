package vllmserver

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/sim/engine"
)

// BenchmarkCompletion measures the server's own overhead per request over
// loopback HTTP: the vector's 402-token prompt, tokenized through the
// prefix cache, one output token, the engine 10^6 times faster than real.
func BenchmarkCompletion(b *testing.B) {
	for _, stream := range []bool{false, true} {
		name := "json"
		if stream {
			name = "sse"
		}
		b.Run(name, func(b *testing.B) {
			o := testOptions(b)
			o.TimeScale = 1e6
			s := startServer(b, o)
			vec := testutil.LoadHashVector(b)
			body := []byte(`{"model":"Qwen/Qwen3-0.6B","max_tokens":1,"stream":` + map[bool]string{true: "true", false: "false"}[stream] +
				`,"prompt":` + string(mustJSON(b, vec.Prompt)) + `}`)
			url := s.URL() + "/v1/completions"
			b.ResetTimer()
			for b.Loop() {
				resp, err := http.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

// BenchmarkEventSink measures converting and publishing one step's
// BlockStored event for a 400-token prompt (25 blocks).
func BenchmarkEventSink(b *testing.B) {
	pub, err := kvwire.NewPublisher(b.Context(), kvwire.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", QueueSize: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	sink := newEventSink(pub, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ev := &engine.BlockStored{BlockHashes: make([]uint64, 25), TokenIDs: make([]int, 400), BlockSize: 16, Medium: engine.MediumGPU}
	for i := range ev.BlockHashes {
		ev.BlockHashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = 1000 + i*37
	}
	batch := []engine.Event{ev}
	for b.Loop() {
		sink.Publish(batch)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}
