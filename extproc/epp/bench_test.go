package epp

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prefixhash"
)

// envoyChunk is the body chunk size Envoy streams to ext_proc.
const envoyChunk = 64 << 10

// BenchmarkDecisions measures ext_proc decisions per second of a real
// `kvgate epp` (default profile, 8 endpoints) over loopback gRPC, for
// prompts of several sizes, on both ways in: the compatible body path
// (FULL_DUPLEX_STREAMED: the body crosses gRPC twice, is parsed and hashed)
// and kvgate's headers path (request body mode NONE: the wasm filter's
// x-kvgate-* headers only). Each iteration is one whole request: headers,
// body, decision, re-sent body, response headers and body.
func BenchmarkDecisions(b *testing.B) {
	pages := make([]string, 8)
	for i := range pages {
		pages[i] = vllmMetrics(i%3, 0.1*float64(i), "")
	}
	// The production scrape interval: the tests' 10 ms would let a
	// CPU-starved benchmark time scrapes out and evict the endpoints.
	f := startFleetWith(b, func(o *Options) { o.RefreshMetricsInterval = 50 * time.Millisecond }, pages...)
	for _, size := range []int{1 << 10, 16 << 10, 220 << 10} {
		prompt := benchPrompt(size)
		body := fmt.Sprintf(`{"model":"base","prompt":%q,"max_tokens":16}`, prompt)
		b.Run(fmt.Sprintf("path=body/prompt=%dKB", size>>10), func(b *testing.B) {
			msgs := []*extprocv3.ProcessingRequest{envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}
			for i := 0; i < len(body); i += envoyChunk {
				end := min(len(body), i+envoyChunk)
				msgs = append(msgs, envoytest.RequestBody([]byte(body[i:end]), end == len(body)))
			}
			benchDecisions(b, f, msgs, 1+(len(body)+server.DefaultBodyChunkSize-1)/server.DefaultBodyChunkSize)
		})
		b.Run(fmt.Sprintf("path=headers/prompt=%dKB", size>>10), func(b *testing.B) {
			kv := []string{":method", "POST", ":path", "/v1/completions", "content-type", "application/json"}
			filterHints(b, body).Encode(func(name, value string) { kv = append(kv, name, value) })
			h := envoytest.WithModes(envoytest.RequestHeaders(false, kv...), procmode.ProcessingMode_NONE, procmode.ProcessingMode_FULL_DUPLEX_STREAMED)
			benchDecisions(b, f, []*extprocv3.ProcessingRequest{h}, 1)
		})
	}
}

// benchPrompt is size bytes of varied text: one of 16 shared system prompts
// and a unique tail, so that the prefix index holds and matches real
// prefixes.
func benchPrompt(size int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < size; i++ {
		fmt.Fprintf(&sb, "Line %d of the shared instructions: route every request well. ", i)
	}
	return sb.String()[:size]
}

// filterHints are the headers the wasm filter writes for body in its
// default approximate mode.
func filterHints(tb testing.TB, body string) hints.Hints {
	tb.Helper()
	r, err := openai.Parse(openai.Completions, []byte(body))
	if err != nil {
		tb.Fatal(err)
	}
	seed, hashes := prefixhash.Request(prefixhash.Params{BlockChars: 64, MaxBlocks: 256}, r)
	p, err := hints.NewPrefix(hints.Approximate, 16, seed, hashes, 256)
	if err != nil {
		tb.Fatal(err)
	}
	return hints.Hints{Model: r.Model, PromptLen: hints.EstimateTokens(len(r.Prompt)), MaxTokens: r.MaxTokens, Prefix: &p}
}

func benchDecisions(b *testing.B, f *fleet, request []*extprocv3.ProcessingRequest, replies int) {
	response := []*extprocv3.ProcessingRequest{
		envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"),
		envoytest.ResponseBody([]byte(`{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":9,"completion_tokens":1}}`), true),
	}
	ctx := context.Background()
	b.SetParallelism(8) // Envoy keeps many streams in flight per connection
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s, err := f.client.Process(ctx)
			if err == nil {
				err = exchange(s, request, replies)
			}
			if err == nil {
				err = exchange(s, response, 2)
			}
			if err == nil {
				err = s.CloseSend()
			}
			if err == nil {
				if _, err = s.Recv(); err == io.EOF {
					err = nil
				}
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}

func exchange(s extprocv3.ExternalProcessor_ProcessClient, msgs []*extprocv3.ProcessingRequest, replies int) error {
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	for range replies {
		r, err := s.Recv()
		if err != nil {
			return err
		}
		if r.GetImmediateResponse() != nil {
			return fmt.Errorf("picker answered %v", r.GetImmediateResponse())
		}
	}
	return nil
}
