package vllmserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// TestRepeatedPromptHitsCache: the second identical prompt is served from
// the prefix cache: cached_tokens, a prefix-cache hit in /metrics and a
// shorter simulated TTFT.
func TestRepeatedPromptHitsCache(t *testing.T) {
	o := testOptions(t)
	// A slow model and a long prompt make the prefill dominate TTFT by far.
	o.Preset = "llama-3.1-8b-h100"
	// Scheduling delays of the test process count scaled (a wall-clock
	// delay d is d × TimeScale simulated seconds); a scale below 1 keeps
	// them small next to the modelled prefill on a loaded machine (at 2, a
	// CI run's 40 ms of delays made the cached repeat 63 ms, not under
	// half of the cold 93 ms). At 0.05 the repeat stays under half of the
	// cold prefill with up to about 700 ms of such delays, ten times the
	// worst seen; the cold prefill takes about 2 s of wall time.
	o.TimeScale = 0.05
	s := startServer(t, o)
	vec := testutil.LoadHashVector(t)
	prompt := strings.Repeat(vec.Prompt+"\n", 8)
	body := map[string]any{"model": o.Model, "prompt": prompt, "max_tokens": 2}

	first := complete(t, s, "/v1/completions", body)
	ttft1, n1 := histogramSum(t, s, "vllm:time_to_first_token_seconds")
	second := complete(t, s, "/v1/completions", body)
	ttftSum, n2 := histogramSum(t, s, "vllm:time_to_first_token_seconds")
	ttft2 := ttftSum - ttft1

	t.Logf("simulated TTFT: %.2f ms cold, %.2f ms with %d of %d prompt tokens cached",
		ttft1*1e3, ttft2*1e3, second.Usage.PromptTokensDetails.CachedTokens, second.Usage.PromptTokens)
	if first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first request: cached_tokens %d, want 0", first.Usage.PromptTokensDetails.CachedTokens)
	}
	p := second.Usage.PromptTokens
	if c := second.Usage.PromptTokensDetails.CachedTokens; c != (p-1)/o.BlockSize*o.BlockSize {
		t.Errorf("second request: cached_tokens %d of %d prompt tokens, want every full block but the last token's", c, p)
	}
	if n1 != 1 || n2 != 2 || !(ttft2 < ttft1/2) {
		t.Errorf("simulated TTFT: first %.4fs, repeated %.4fs (samples %d, %d); want the repeat under half", ttft1, ttft2, n1, n2)
	}
	if hits := counterValue(t, s, "vllm:prefix_cache_hits_total"); hits != float64(second.Usage.PromptTokensDetails.CachedTokens) {
		t.Errorf("vllm:prefix_cache_hits_total = %v, want %d", hits, second.Usage.PromptTokensDetails.CachedTokens)
	}
	if q := counterValue(t, s, "vllm:prefix_cache_queries_total"); q != float64(2*p) {
		t.Errorf("vllm:prefix_cache_queries_total = %v, want %d", q, 2*p)
	}
}

// TestStreaming checks the SSE framing of both APIs: data lines, the
// chat role chunk, finish_reason on the last text chunk, the usage chunk
// with empty choices, and [DONE]; the streamed text equals the JSON one.
func TestStreaming(t *testing.T) {
	for _, tc := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "Once upon a time"}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Hi"}}}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			s := startServer(t, testOptions(t))
			tc.body["model"], tc.body["max_tokens"] = s.models.base[0], 7
			tc.body["stream"], tc.body["stream_options"] = true, map[string]any{"include_usage": true}
			status, raw := post(t, s.URL()+tc.path, tc.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, raw)
			}
			events := sseEvents(t, raw)
			if len(events) < 3 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events %q", events)
			}
			chat := tc.path == "/v1/chat/completions"
			var text strings.Builder
			var id string
			finished := false
			for i, e := range events[:len(events)-2] {
				var c completionResponse
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("chunk %q: %v", e, err)
				}
				if id == "" {
					id = c.ID
				}
				if c.ID != id || c.Usage != nil || len(c.Choices) != 1 || finished {
					t.Fatalf("chunk %d: %q", i, e)
				}
				ch := c.Choices[0]
				if chat {
					want := "chat.completion.chunk"
					if c.Object != want || (i == 0) != (ch.Delta.Role != nil) {
						t.Fatalf("chunk %d: %q", i, e)
					}
					if ch.Delta.Content != nil {
						text.WriteString(*ch.Delta.Content)
					}
				} else {
					if c.Object != "text_completion" {
						t.Fatalf("chunk %d: %q", i, e)
					}
					text.WriteString(ch.Text)
				}
				if ch.FinishReason != nil {
					finished = *ch.FinishReason == "length"
				}
			}
			if !finished {
				t.Fatalf("no chunk finished with length: %q", events)
			}
			var last completionResponse
			if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil {
				t.Fatal(err)
			}
			if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 7 ||
				last.Usage.TotalTokens != last.Usage.PromptTokens+7 {
				t.Fatalf("usage chunk %q", events[len(events)-2])
			}
			// The same stream through the shared usage parser the picker uses.
			sc := openai.NewUsageScanner(true)
			_, _ = sc.Write(raw)
			if u, ok := sc.Usage(); !ok || u.CompletionTokens != 7 || !sc.Done() {
				t.Fatalf("UsageScanner: %+v %v done=%v", u, ok, sc.Done())
			}

			// Streamed text is the decoded tokens, as the JSON answer's is:
			// the same seed and the same request order give the same id,
			// hence the same tokens, on a fresh server.
			o := testOptions(t)
			o.Seed = s.opts.Seed
			fresh := startServer(t, o)
			tc.body["stream"] = false
			delete(tc.body, "stream_options")
			r := complete(t, fresh, tc.path, tc.body)
			got := r.Choices[0].Text
			if chat {
				got = r.Choices[0].Message.Content
			}
			if r.ID != id || got != text.String() {
				t.Fatalf("JSON answer %s %q, streamed %s %q", r.ID, got, id, text.String())
			}
		})
	}
}

// TestChatTemplate: a chat prompt is the tokenizer's chat template with the
// generation prompt, and echo mode answers with the last message.
func TestChatTemplate(t *testing.T) {
	o := testOptions(t)
	o.Echo = true
	s := startServer(t, o)
	msgs := []tokenizer.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Say hello to the world"}}
	text, err := s.tok.ApplyChatTemplate(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(text, "<|im_start|>assistant\n") {
		t.Fatalf("rendered prompt lacks the generation prompt: %q", text)
	}
	body := map[string]any{"model": o.Model, "max_tokens": 50, "messages": []map[string]string{
		{"role": "system", "content": msgs[0].Content}, {"role": "user", "content": msgs[1].Content}}}
	r := complete(t, s, "/v1/chat/completions", body)
	if r.Object != "chat.completion" || r.Usage.PromptTokens != len(s.tok.Encode(text)) {
		t.Fatalf("object %q, prompt_tokens %d, want %d", r.Object, r.Usage.PromptTokens, len(s.tok.Encode(text)))
	}
	c := r.Choices[0]
	if c.Message.Role != "assistant" || c.Message.Content != msgs[1].Content || *c.FinishReason != "stop" ||
		r.Usage.CompletionTokens != len(s.tok.Encode(msgs[1].Content)) {
		t.Fatalf("echo answer %+v usage %+v", c, r.Usage)
	}
	// Fewer max_tokens than the echo cut it short.
	body["max_tokens"] = 2
	r = complete(t, s, "/v1/chat/completions", body)
	if *r.Choices[0].FinishReason != "length" || r.Usage.CompletionTokens != 2 ||
		!strings.HasPrefix(msgs[1].Content, r.Choices[0].Message.Content) {
		t.Fatalf("short echo %+v usage %+v", r.Choices[0], r.Usage)
	}
}

func TestModels(t *testing.T) {
	o := testOptions(t)
	o.ServedModelNames = []string{"qwen", "qwen-alias"}
	o.LoRAModules = []LoRAModule{{Name: "alice", Path: "/adapters/alice"}}
	s := startServer(t, o)
	resp, err := http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if list.Object != "list" || !slices.Equal(ids, []string{"qwen", "qwen-alias", "alice"}) ||
		list.Data[2].Parent == nil || *list.Data[2].Parent != "qwen" || list.Data[2].Root != "/adapters/alice" ||
		list.Data[0].Root != o.Model {
		t.Fatalf("models %+v", list)
	}
	// Every listed name is servable; the adapter's requests carry its name.
	for _, id := range ids {
		r := complete(t, s, "/v1/completions", map[string]any{"model": id, "prompt": "hi", "max_tokens": 1})
		if r.Model != id {
			t.Fatalf("model %q answered as %q", id, r.Model)
		}
	}
	info := gather(t, s, "vllm:lora_requests_info").GetMetric()[0]
	if labels := labelMap(info.GetLabel()); labels["max_lora"] != "1" || info.GetGauge().GetValue() <= 0 {
		t.Fatalf("lora_requests_info %v", info)
	}
}

// TestErrors checks the status and vLLM's error body of each refusal.
func TestErrors(t *testing.T) {
	o := testOptions(t)
	o.MaxModelLen = 64
	s := startServer(t, o)
	failing := func() Options {
		f := testOptions(t)
		f.FailureRate = 1
		return f
	}()
	fs := startServer(t, failing)
	for _, tc := range []struct {
		name   string
		srv    *Server
		path   string
		body   string
		status int
		typ    string
		msg    string
	}{
		{"bad json", s, "/v1/completions", `{"model":`, 400, "BadRequestError", "not a JSON object"},
		{"no prompt", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B"}`, 400, "BadRequestError", "prompt is required"},
		{"no messages", s, "/v1/chat/completions", `{"model":"Qwen/Qwen3-0.6B","messages":[]}`, 400, "BadRequestError", "at least one message"},
		{"unknown model", s, "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"too long", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":"x","max_tokens":100}`, 400, "BadRequestError", "maximum context length is 64 tokens"},
		{"prompt too long", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":[` + strings.Repeat("1,", 80) + `1]}`, 400, "BadRequestError", "maximum context length"},
		{"bad token id", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":[1,-5]}`, 400, "BadRequestError", "out of vocabulary"},
		{"bad kv params", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":"x","kv_transfer_params":7}`, 400, "BadRequestError", "kv_transfer_params"},
		{"both legs", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":"x","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":true}}`, 400, "BadRequestError", "exclusive"},
		{"negative max_tokens", s, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":"x","max_tokens":-1}`, 400, "BadRequestError", "non-negative"},
		{"injected", fs, "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":"x"}`, 500, "InternalServerError", "injected failure"},
		{"release unknown", s, "/kvgate/release_kv", `{"request_id":"nope"}`, 404, "NotFoundError", "no held KV blocks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, raw := post(t, tc.srv.URL()+tc.path, tc.body)
			e, err := errorBody(raw)
			if err != nil {
				t.Fatalf("body %s: %v", raw, err)
			}
			if status != tc.status || e.Code != tc.status || e.Type != tc.typ ||
				e.Param != nil || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("status %d body %s", status, raw)
			}
		})
	}
	// Paths and methods vLLM does not serve get FastAPI's JSON answers.
	for _, tc := range []struct {
		method, path string
		status       int
	}{{"GET", "/v1/completions", 405}, {"GET", "/nope", 404}, {"POST", "/v1/models", 405}} {
		req, _ := http.NewRequest(tc.method, s.URL()+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !json.Valid(raw) {
			t.Errorf("%s %s = %d %s", tc.method, tc.path, resp.StatusCode, raw)
		}
	}
}

// TestQueueFull: with one running and one waiting request, a third gets
// 429.
func TestQueueFull(t *testing.T) {
	o := testOptions(t)
	o.TimeScale, o.MaxNumSeqs, o.MaxWaiting = 1, 1, 1
	s := startServer(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 2)
	hold := func() {
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions",
				strings.NewReader(`{"model":"Qwen/Qwen3-0.6B","prompt":"hold the line","max_tokens":5000}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	// One at a time: sent together, the second can find the first still
	// in the one-place waiting queue and be refused itself.
	hold()
	waitFor(t, "one running request", func() bool { return s.Engine().Metrics().Running == 1 })
	hold()
	waitFor(t, "one running and one waiting request", func() bool {
		m := s.Engine().Metrics()
		return m.Running == 1 && m.Waiting == 1
	})
	status, raw := post(t, s.URL()+"/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":"x"}`)
	if e, err := errorBody(raw); err != nil || status != 429 || e.Type != "RateLimitError" || e.Code != 429 {
		t.Fatalf("status %d body %s", status, raw)
	}
	// Clients that go away free the engine.
	cancel()
	<-done
	<-done
	waitFor(t, "aborted requests to leave the engine", func() bool {
		m := s.Engine().Metrics()
		return m.Running == 0 && m.Waiting == 0
	})
}

// TestClientDisconnectAborts: a streaming client that hangs up mid-stream
// has its request aborted, freeing its KV blocks.
func TestClientDisconnectAborts(t *testing.T) {
	o := testOptions(t)
	o.TimeScale = 1
	s := startServer(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions",
		strings.NewReader(`{"model":"Qwen/Qwen3-0.6B","prompt":"tell me everything","max_tokens":10000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil || !strings.HasPrefix(string(buf), "data: ") {
		t.Fatalf("first read %q: %v", buf, err)
	}
	if m := s.Engine().Metrics(); m.Running != 1 || m.KVUsage == 0 {
		t.Fatalf("engine while streaming: %+v", m)
	}
	cancel()
	waitFor(t, "the engine to drop the request", func() bool {
		m := s.Engine().Metrics()
		return m.Running == 0 && m.KVUsage == 0
	})
	if mf := findFamily(t, s, "vllm:request_success_total"); mf != nil {
		t.Fatalf("aborted request counted as a success: %v", mf)
	}
}

// TestMetricsExposition: /metrics serves vLLM's names with model_name and
// engine labels on the server's own registry.
func TestMetricsExposition(t *testing.T) {
	o := testOptions(t)
	o.NumGPUBlocks = 1000
	s := startServer(t, o)
	complete(t, s, "/v1/completions", map[string]any{"model": o.Model, "prompt": "a b c", "max_tokens": 3})
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(raw)
	for _, want := range []string{
		`vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 0`,
		`vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0`,
		`vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 3`,
		`vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 3`,
		`vllm:prefix_cache_queries_total{`, `vllm:prefix_cache_hits_total{`,
		`num_gpu_blocks="1000"`, `block_size="16"`, `vllm:cache_config_info{`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 1`,
		`vllm:inter_token_latency_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 2`,
		`vllm:e2e_request_latency_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 1`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-0.6B"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(text, "vllm:lora_requests_info") {
		t.Error("lora_requests_info exported without LoRA, which vLLM does not")
	}
	resp, err = http.Get(s.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health: %v %v", resp, err)
	}
	resp.Body.Close()
}
