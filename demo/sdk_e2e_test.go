package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// sdkShapes drives the gateway with the official OpenAI SDK in every
// request shape a client sends to a vLLM server, and prints one JSON line
// per case: its name and either the SDK's result or its error's status and
// message. The Go test judges each line; the script only records.
const sdkShapes = `'use strict';
const OpenAI = require('openai');
const client = new OpenAI({ apiKey: 'unused', baseURL: process.argv[2], maxRetries: 0, timeout: 60000 });
const model = process.argv[3];
const msgs = [{ role: 'user', content: 'Hello there 😀 日本語, how are you?' }];
const weather = { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } };
const png = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const all = async (s) => { const out = []; for await (const c of s) out.push(c); return out; };
const chat = (o, opts) => client.chat.completions.create({ model, messages: msgs, max_tokens: 4, ...o }, opts);
const cases = {
  models: async () => all(await client.models.list()),
  chat: () => chat({}),
  max_completion_tokens: () => client.chat.completions.create({ model, messages: msgs, max_completion_tokens: 3 }),
  chat_stream: async () => all(await chat({ stream: true })),
  chat_stream_usage: async () => all(await chat({ stream: true, stream_options: { include_usage: true } })),
  completions: () => client.completions.create({ model, prompt: 'The capital of France is', max_tokens: 4 }),
  completions_stream_usage: async () => all(await client.completions.create({ model, prompt: 'Hello', max_tokens: 4, stream: true, stream_options: { include_usage: true } })),
  completions_token_ids: () => client.completions.create({ model, prompt: [9707, 1879, 13], max_tokens: 2 }),
  sampling: () => chat({ stop: ['\n', 'END'], seed: 7, user: 'alice', temperature: 0.5, top_p: 0.9, presence_penalty: 0.1, frequency_penalty: 0.1, logprobs: true, top_logprobs: 2 }),
  tools: () => chat({ tools: [weather], tool_choice: 'auto' }),
  tool_named: () => chat({ tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } } }),
  json_schema: () => chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string' } } } } } }),
  vllm_extra_body: () => chat({ cache_salt: 'tenant-a', top_k: 5, min_tokens: 1, skip_special_tokens: true, chat_template_kwargs: { enable_thinking: false } }),
  priority_unscheduled: () => chat({ priority: 5 }),
  image_url: () => client.chat.completions.create({ model, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello there 😀 日本語, how are you?' }, { type: 'image_url', image_url: { url: png } }] }] }),
  agent_turns: () => client.chat.completions.create({ model, max_tokens: 2, messages: [
    { role: 'developer', content: 'be brief' }, { role: 'system', content: [{ type: 'text', text: 'sys' }] }, { role: 'user', content: 'hi' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'sunny' }] }),
  megabyte_prompt: () => client.chat.completions.create({ model, max_tokens: 2, messages: [{ role: 'user', content: 'é😀 '.repeat(1 << 18) }] }),
  unknown_model: () => client.chat.completions.create({ model: 'no-such-model', messages: msgs, max_tokens: 2 }),
  abort_stream: async () => {
    const ac = new AbortController();
    const s = await chat({ max_tokens: 4000, stream: true }, { signal: ac.signal });
    let n = 0;
    try { for await (const c of s) { if (++n === 3) ac.abort(); } } catch (e) { return { chunks: n, error: e.constructor.name }; }
    return { chunks: n, error: null };
  },
};
(async () => {
  for (const [name, fn] of Object.entries(cases)) {
    try { console.log(JSON.stringify({ name, result: await fn() })); }
    catch (e) { console.log(JSON.stringify({ name, status: e.status ?? 0, message: String(e.message) })); }
  }
})();
`

type sdkUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type sdkChoice struct {
	Index   int `json:"index"`
	Message *struct {
		Role      string  `json:"role"`
		Content   *string `json:"content"`
		ToolCalls []struct {
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"message"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	Text         *string `json:"text"`
	FinishReason *string `json:"finish_reason"`
}

type sdkCompletion struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Model   string      `json:"model"`
	Choices []sdkChoice `json:"choices"`
	Usage   *sdkUsage   `json:"usage"`
}

type sdkLine struct {
	Name    string          `json:"name"`
	Result  json.RawMessage `json:"result"`
	Status  int             `json:"status"`
	Message string          `json:"message"`
}

// TestOpenAISDKShapes runs the SDK through gateway, filter, picker and
// simulators over loopback and checks each answer has the shape vLLM's
// OpenAI server gives: usage with cached_tokens, the usage-only last chunk
// of include_usage, vLLM's errors, and no request left running after a
// client aborts its stream.
func TestOpenAISDKShapes(t *testing.T) {
	needE2E(t)
	nodePath := filepath.Join(repoRootDir, ".cache", "npm-openai", "node_modules")
	if _, err := os.Stat(filepath.Join(nodePath, "openai", "package.json")); err != nil {
		t.Skip("OpenAI SDK not installed (bash scripts/setup-openai-sdk.sh)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not installed (make setup)")
	}
	s := startStack(t, StackConfig{Replicas: 2, Policy: PolicyLoad})
	script := filepath.Join(t.TempDir(), "shapes.cjs")
	if err := os.WriteFile(script, []byte(sdkShapes), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, s.GatewayURL+"/v1", Model)
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodePath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	got := map[string]sdkLine{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l sdkLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("script line %q: %v", sc.Text(), err)
		}
		got[l.Name] = l
	}

	completion := func(t *testing.T, l sdkLine, object string, maxTokens int) sdkCompletion {
		t.Helper()
		var c sdkCompletion
		if err := json.Unmarshal(l.Result, &c); err != nil {
			t.Fatalf("result %s: %v", l.Result, err)
		}
		if c.Object != object || c.Model != Model || c.ID == "" || len(c.Choices) != 1 {
			t.Fatalf("object %q model %q id %q, %d choices; want %s of %s with 1 choice", c.Object, c.Model, c.ID, len(c.Choices), object, Model)
		}
		ch := c.Choices[0]
		if object == "chat.completion" && (ch.Message == nil || ch.Message.Role != "assistant" || ch.Message.Content == nil) {
			t.Fatalf("choice %+v lacks an assistant message with content", ch)
		}
		if object == "text_completion" && ch.Text == nil {
			t.Fatalf("choice %+v lacks text", ch)
		}
		checkUsage(t, c.Usage, maxTokens)
		return c
	}
	chatOK := func(maxTokens int) func(*testing.T, sdkLine) {
		return func(t *testing.T, l sdkLine) { completion(t, l, "chat.completion", maxTokens) }
	}
	failsWith := func(status int, message string) func(*testing.T, sdkLine) {
		return func(t *testing.T, l sdkLine) {
			if l.Status != status || !bytes.Contains([]byte(l.Message), []byte(message)) {
				t.Fatalf("status %d %q, want %d with %q (result %s)", l.Status, l.Message, status, message, l.Result)
			}
		}
	}
	textOnly := 0
	for _, tc := range []struct {
		name  string
		check func(*testing.T, sdkLine)
	}{
		{"models", func(t *testing.T, l sdkLine) {
			var ms []struct {
				ID     string `json:"id"`
				Object string `json:"object"`
			}
			if err := json.Unmarshal(l.Result, &ms); err != nil || len(ms) == 0 || ms[0].ID != Model || ms[0].Object != "model" {
				t.Fatalf("models %s (%v), want %s", l.Result, err, Model)
			}
		}},
		{"chat", func(t *testing.T, l sdkLine) {
			c := completion(t, l, "chat.completion", 4)
			textOnly = c.Usage.PromptTokens
		}},
		{"max_completion_tokens", chatOK(3)},
		{"chat_stream", func(t *testing.T, l sdkLine) {
			chunks := streamChunks(t, l, "chat.completion.chunk")
			for _, c := range chunks {
				if c.Usage != nil {
					t.Fatalf("usage %+v without stream_options.include_usage", c.Usage)
				}
			}
		}},
		{"chat_stream_usage", func(t *testing.T, l sdkLine) { usageChunk(t, streamChunks(t, l, "chat.completion.chunk"), 4) }},
		{"completions", func(t *testing.T, l sdkLine) { completion(t, l, "text_completion", 4) }},
		{"completions_stream_usage", func(t *testing.T, l sdkLine) { usageChunk(t, streamChunks(t, l, "text_completion"), 4) }},
		{"completions_token_ids", func(t *testing.T, l sdkLine) {
			if c := completion(t, l, "text_completion", 2); c.Usage.PromptTokens != 3 {
				t.Fatalf("prompt_tokens %d for 3 token ids", c.Usage.PromptTokens)
			}
		}},
		{"sampling", chatOK(4)},
		{"tools", chatOK(4)},
		// vLLM's guided decoding forces the named tool's call.
		{"tool_named", func(t *testing.T, l sdkLine) {
			m := completion(t, l, "chat.completion", 4).Choices[0].Message
			var args map[string]any
			if len(m.ToolCalls) != 1 || m.ToolCalls[0].Type != "function" || m.ToolCalls[0].Function.Name != "get_weather" ||
				json.Unmarshal([]byte(m.ToolCalls[0].Function.Arguments), &args) != nil {
				t.Fatalf("message %+v: want one get_weather call with JSON arguments", *m)
			}
		}},
		{"json_schema", chatOK(4)},
		{"vllm_extra_body", chatOK(4)},
		// vLLM's engine refuses a priority unless it schedules by priority.
		{"priority_unscheduled", failsWith(400, "Priority scheduling is not enabled")},
		{"image_url", func(t *testing.T, l sdkLine) {
			// The image adds its placeholder tokens to the same text's.
			if c := completion(t, l, "chat.completion", 2); c.Usage.PromptTokens <= textOnly {
				t.Fatalf("prompt_tokens %d with an image, %d without", c.Usage.PromptTokens, textOnly)
			}
		}},
		{"agent_turns", chatOK(2)},
		// A megabyte crosses filter, picker and gateway whole, and the
		// server refuses it as vLLM does: longer than the model's context.
		{"megabyte_prompt", failsWith(400, "maximum context length")},
		{"unknown_model", failsWith(404, "does not exist")},
		{"abort_stream", func(t *testing.T, l sdkLine) {
			var r struct {
				Chunks int    `json:"chunks"`
				Error  string `json:"error"`
			}
			if err := json.Unmarshal(l.Result, &r); err != nil || r.Chunks != 3 {
				t.Fatalf("abort %s (%v): want the stream cut after 3 chunks", l.Result, err)
			}
			awaitIdle(t, s.Sims)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, ok := got[tc.name]
			if !ok {
				t.Fatalf("the script printed no %s line:\n%s\n%s", tc.name, out, stderr.String())
			}
			if tc.check == nil {
				return
			}
			tc.check(t, l)
		})
	}
}

func checkUsage(t *testing.T, u *sdkUsage, maxTokens int) {
	t.Helper()
	switch {
	case u == nil:
		t.Fatal("no usage")
	case u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.CompletionTokens > maxTokens || u.TotalTokens != u.PromptTokens+u.CompletionTokens:
		t.Fatalf("usage %+v for at most %d tokens", *u, maxTokens)
	case u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == nil:
		t.Fatalf("usage %+v lacks prompt_tokens_details.cached_tokens", *u)
	}
}

func streamChunks(t *testing.T, l sdkLine, object string) []sdkCompletion {
	t.Helper()
	var chunks []sdkCompletion
	if err := json.Unmarshal(l.Result, &chunks); err != nil || len(chunks) < 2 {
		t.Fatalf("stream %s (%v): want chunks", l.Result, err)
	}
	finished := false
	for _, c := range chunks {
		if c.Object != object || c.ID != chunks[0].ID {
			t.Fatalf("chunk %+v: want %s of id %s", c, object, chunks[0].ID)
		}
		for _, ch := range c.Choices {
			finished = finished || ch.FinishReason != nil
		}
	}
	if !finished {
		t.Fatalf("no chunk carries a finish_reason: %s", l.Result)
	}
	return chunks
}

// usageChunk checks include_usage's last chunk: no choices, the usage.
func usageChunk(t *testing.T, chunks []sdkCompletion, maxTokens int) {
	t.Helper()
	last := chunks[len(chunks)-1]
	if len(last.Choices) != 0 {
		t.Fatalf("last chunk %+v has choices; include_usage ends with a usage-only chunk", last)
	}
	checkUsage(t, last.Usage, maxTokens)
	for _, c := range chunks[:len(chunks)-1] {
		if c.Usage != nil {
			t.Fatalf("usage %+v before the last chunk", c.Usage)
		}
	}
}

// awaitIdle waits for every simulator to report no request running or
// waiting: an aborted stream must free its engine slot.
func awaitIdle(t *testing.T, sims []Sim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	c := &http.Client{Timeout: 5 * time.Second}
	for {
		busy := 0.0
		for _, sim := range sims {
			m, err := scrapeSim(ctx, c, sim.Addr)
			if err != nil {
				t.Fatalf("scrape %s: %v", sim.Name, err)
			}
			busy += m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]
		}
		if busy == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%v requests still running or waiting after the client aborted its stream", busy)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
