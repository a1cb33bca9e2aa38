package vllmserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/internal/zmtp"
	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// testTimeout bounds every wait so that a broken test fails instead of
// hanging; nothing asserts how long anything takes.
const testTimeout = 20 * time.Second

var (
	tokOnce sync.Once
	tokVal  *tokenizer.Tokenizer
	tokErr  error
)

// qwen3 loads the Qwen3 tokenizer once per test binary.
func qwen3(tb testing.TB) *tokenizer.Tokenizer {
	tb.Helper()
	dir := testutil.TokenizerDir(tb)
	tokOnce.Do(func() { tokVal, tokErr = tokenizer.Load(dir) })
	if tokErr != nil {
		tb.Fatalf("load tokenizer: %v", tokErr)
	}
	return tokVal
}

// testOptions configure a server like `kvgate sim --model Qwen/Qwen3-0.6B
// --block-size 16 --hash-seed 42` on a free loopback port, 20× real time.
func testOptions(tb testing.TB) Options {
	o := DefaultOptions()
	o.Host, o.Port = "127.0.0.1", 0
	o.Tokenizer = qwen3(tb)
	o.TimeScale = 20
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return o
}

// startServer runs a server until the test ends.
func startServer(tb testing.TB, o Options) *Server {
	tb.Helper()
	s, err := New(o)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	return s
}

// post sends a JSON body and returns the status and the response body.
func post(tb testing.TB, url string, body any) (int, []byte) {
	tb.Helper()
	return postCtx(tb, context.Background(), url, body)
}

func postCtx(tb testing.TB, ctx context.Context, url string, body any) (int, []byte) {
	tb.Helper()
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			tb.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, testTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, out
}

// completionResponse is the part of a response the tests read.
type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage            *usage                 `json:"usage"`
	KVTransferParams *vllm.KVTransferParams `json:"kv_transfer_params"`
}

// complete posts a completion that must succeed.
func complete(tb testing.TB, s *Server, path string, body map[string]any) completionResponse {
	tb.Helper()
	status, raw := post(tb, s.URL()+path, body)
	if status != http.StatusOK {
		tb.Fatalf("POST %s = %d %s", path, status, raw)
	}
	var r completionResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		tb.Fatalf("response %s: %v", raw, err)
	}
	return r
}

// sseEvents splits an SSE body into its data payloads, failing on any
// framing but vLLM's: one data line an event, nothing else.
func sseEvents(tb testing.TB, body []byte) []string {
	tb.Helper()
	var out []string
	r := testutil.NewSSEReader(bytes.NewReader(body))
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return out
		}
		switch {
		case err != nil:
			tb.Fatal(err)
		case len(ev.Other) > 0:
			tb.Fatalf("unexpected SSE line %q", ev.Other[0])
		case len(ev.Data) > 1:
			tb.Fatalf("two data lines in one event: %q", body)
		}
		out = append(out, ev.Data[0])
	}
}

// gather reads one metric family from the server's registry.
func gather(tb testing.TB, s *Server, name string) *dto.MetricFamily {
	tb.Helper()
	mf := findFamily(tb, s, name)
	if mf == nil {
		tb.Fatalf("metric %s not exported", name)
	}
	return mf
}

// findFamily is gather for a family that may have no series yet.
func findFamily(tb testing.TB, s *Server, name string) *dto.MetricFamily {
	tb.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

func counterValue(tb testing.TB, s *Server, name string) float64 {
	tb.Helper()
	return gather(tb, s, name).GetMetric()[0].GetCounter().GetValue()
}

func histogramSum(tb testing.TB, s *Server, name string) (sum float64, count uint64) {
	tb.Helper()
	h := gather(tb, s, name).GetMetric()[0].GetHistogram()
	return h.GetSampleSum(), h.GetSampleCount()
}

// waitFor is testutil.WaitFor under the name the package's tests use.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	testutil.WaitFor(tb, what, cond)
}

// subscribe connects a plain SUB socket to the server's KV events and
// beats the slow-joiner loss: it sends small distinct requests until one
// of their events arrives. The returned channel carries every later
// message; it closes when the test ends.
func subscribe(tb testing.TB, s *Server) <-chan zmtp.Msg {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := zmtp.Dial(ctx, "tcp://"+s.KVEventsAddr(), zmtp.DialConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.SUB}})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cancel()
		_ = sub.Close()
	})
	msgs := make(chan zmtp.Msg, 1024)
	go func() {
		defer close(msgs) // also when subscribing failed: nextBatch says so
		zmtptest.Subscriber(msgs, testTimeout)(ctx, sub)
	}()
	deadline := time.After(testTimeout)
	for i := 0; ; i++ {
		prompt := make([]int, s.engCfg.BlockSize)
		for k := range prompt {
			prompt[k] = 150000 - i // distinct from every prompt the tests send
		}
		complete(tb, s, "/v1/completions", map[string]any{"model": s.models.base[0], "prompt": prompt, "max_tokens": 1})
		select {
		case <-msgs:
			return msgs
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			tb.Fatal("KV events never arrived")
		}
	}
}

// nextBatch decodes the next KV-events message, checking its framing.
func nextBatch(tb testing.TB, s *Server, msgs <-chan zmtp.Msg) kvwire.EventBatch {
	tb.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			tb.Fatal("KV events subscription closed")
		}
		if len(m.Frames) != 3 || string(m.Frames[0]) != s.Topic() || len(m.Frames[1]) != 8 {
			tb.Fatalf("bad frames: %q", m.Frames)
		}
		b, skipped, err := kvwire.Decode(m.Frames[2])
		if err != nil || skipped != 0 {
			tb.Fatalf("Decode: %v (skipped %d)", err, skipped)
		}
		return b
	case <-time.After(testTimeout):
		tb.Fatal("timed out waiting for KV events")
	}
	return kvwire.EventBatch{}
}

// hashKeys are the routing keys of hashes.
func hashKeys(hs []kvwire.Hash) []uint64 { return kvwire.Keys(nil, hs) }

func describe(ev kvwire.Event) string { return fmt.Sprintf("%s %+v", ev.Type(), ev) }

func labelMap(pairs []*dto.LabelPair) map[string]string {
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		m[p.GetName()] = p.GetValue()
	}
	return m
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// errorBody decodes vLLM's error body, {"error":{...}} and nothing else
// (the flat body of vLLM before 0.10.1 fails it).
func errorBody(raw []byte) (vllm.ErrorInfo, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var e vllm.ErrorResponse
	if err := dec.Decode(&e); err != nil {
		return vllm.ErrorInfo{}, err
	}
	if e.Error.Message == "" {
		return vllm.ErrorInfo{}, errors.New("no error.message")
	}
	return e.Error, nil
}
