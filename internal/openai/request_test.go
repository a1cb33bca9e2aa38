package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestAPIFromPath(t *testing.T) {
	tests := []struct {
		path string
		want API
		ok   bool
	}{
		{"/v1/chat/completions", ChatCompletions, true},
		{"/v1/completions", Completions, true},
		{"/v1/completions/", Completions, true},
		{"/v1/completions?x=1", Completions, true},
		{"/openai/v1/responses", Responses, true},
		{"/v1/embeddings", Embeddings, true},
		{"/v1/models", "", false},
		{"/v1/completionsx", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, ok := APIFromPath(tt.path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("APIFromPath(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		api     API
		body    string
		wantErr bool
		check   func(t *testing.T, r *Request)
	}{
		{name: "chat", api: ChatCompletions,
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7}`,
			check: func(t *testing.T, r *Request) {
				if r.Model != "m" || !r.Stream || !r.IncludeUsage || r.MaxTokens != 7 || len(r.Messages) != 1 || r.Messages[0].Text() != "hi" {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "chat content parts", api: ChatCompletions,
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			check: func(t *testing.T, r *Request) {
				if got := r.Messages[0].Text(); got != "a\nb" {
					t.Errorf("text = %q", got)
				}
			}},
		{name: "completion string", api: Completions, body: `{"model":"m","prompt":"hello","max_tokens":3}`,
			check: func(t *testing.T, r *Request) {
				if r.Prompt != "hello" || r.MaxTokens != 3 || r.PromptText() != "hello" {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "completion string array", api: Completions, body: `{"model":"m","prompt":["a","b"]}`,
			check: func(t *testing.T, r *Request) {
				if r.Prompt != "ab" {
					t.Errorf("prompt = %q", r.Prompt)
				}
			}},
		{name: "completion token ids", api: Completions, body: `{"model":"m","prompt":[1,2,3]}`,
			check: func(t *testing.T, r *Request) {
				if len(r.PromptTokenIDs) != 3 {
					t.Errorf("ids = %v", r.PromptTokenIDs)
				}
			}},
		{name: "completion token id batch", api: Completions, body: `{"model":"m","prompt":[[1,2],[3]]}`,
			check: func(t *testing.T, r *Request) {
				if len(r.PromptTokenIDs) != 3 {
					t.Errorf("ids = %v", r.PromptTokenIDs)
				}
			}},
		{name: "responses", api: Responses, body: `{"model":"m","input":"q","max_output_tokens":5}`,
			check: func(t *testing.T, r *Request) {
				if r.Input != "q" || r.MaxTokens != 5 {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "embeddings", api: Embeddings, body: `{"model":"m","input":["x"]}`},
		{name: "cache salt", api: Completions, body: `{"model":"m","prompt":"p","cache_salt":"s"}`,
			check: func(t *testing.T, r *Request) {
				if r.CacheSalt != "s" {
					t.Errorf("salt = %q", r.CacheSalt)
				}
			}},
		{name: "null stream is absent", api: Completions, body: `{"model":"m","prompt":"p","stream":null}`},
		{name: "invalid json", api: Completions, body: `{"model":`, wantErr: true},
		{name: "trailing bracket", api: Completions, body: `{"model":"m","prompt":"p"}]`, wantErr: true},
		{name: "trailing object", api: Completions, body: `{"model":"m","prompt":"p"}{}`, wantErr: true},
		{name: "not an object", api: Completions, body: `[1]`, wantErr: true},
		{name: "null", api: Completions, body: `null`, wantErr: true},
		{name: "empty", api: Completions, body: ``, wantErr: true},
		{name: "missing model", api: Completions, body: `{"prompt":"p"}`, wantErr: true},
		{name: "empty model", api: Completions, body: `{"model":"","prompt":"p"}`, wantErr: true},
		{name: "model not a string", api: Completions, body: `{"model":1,"prompt":"p"}`, wantErr: true},
		{name: "missing prompt", api: Completions, body: `{"model":"m"}`, wantErr: true},
		{name: "empty prompt", api: Completions, body: `{"model":"m","prompt":""}`, wantErr: true},
		{name: "empty prompt array", api: Completions, body: `{"model":"m","prompt":[]}`, wantErr: true},
		{name: "prompt object", api: Completions, body: `{"model":"m","prompt":{}}`, wantErr: true},
		{name: "no messages", api: ChatCompletions, body: `{"model":"m","messages":[]}`, wantErr: true},
		{name: "null messages", api: ChatCompletions, body: `{"model":"m","messages":null}`, wantErr: true},
		{name: "messages not array", api: ChatCompletions, body: `{"model":"m","messages":"x"}`, wantErr: true},
		{name: "negative max tokens", api: Completions, body: `{"model":"m","prompt":"p","max_tokens":-1}`, wantErr: true},
		// vLLM: max_completion_tokens wins over the deprecated max_tokens.
		{name: "max_completion_tokens over max_tokens", api: ChatCompletions,
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"max_completion_tokens":2}`,
			check: func(t *testing.T, r *Request) {
				if r.MaxTokens != 2 {
					t.Fatalf("MaxTokens %d, want max_completion_tokens' 2", r.MaxTokens)
				}
			}},
		{name: "null max_completion_tokens falls back", api: ChatCompletions,
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"max_completion_tokens":null}`,
			check: func(t *testing.T, r *Request) {
				if r.MaxTokens != 9 {
					t.Fatalf("MaxTokens %d, want max_tokens' 9", r.MaxTokens)
				}
			}},
		{name: "stream not bool", api: Completions, body: `{"model":"m","prompt":"p","stream":"yes"}`, wantErr: true},
		{name: "missing input", api: Embeddings, body: `{"model":"m"}`, wantErr: true},
		{name: "empty input", api: Responses, body: `{"model":"m","input":""}`, wantErr: true},
		// Anthropic messages and vLLM generate bodies.
		{name: "messages", api: Messages,
			body: `{"model":"claude","system":"be brief","max_tokens":64,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			check: func(t *testing.T, r *Request) {
				if r.Model != "claude" || !r.Stream || r.MaxTokens != 64 || len(r.Messages) != 2 || r.Messages[0].Role != "system" || r.Messages[0].Text() != "be brief" || r.Messages[1].Text() != "hi" {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "messages system blocks", api: Messages,
			body: `{"model":"c","system":[{"type":"text","text":"a"}],"messages":[{"role":"user","content":"x"}]}`,
			check: func(t *testing.T, r *Request) {
				if r.Messages[0].Text() != "a" {
					t.Errorf("system %q", r.Messages[0].Text())
				}
			}},
		{name: "messages no system", api: Messages, body: `{"model":"c","messages":[{"role":"user","content":"x"}]}`,
			check: func(t *testing.T, r *Request) {
				if len(r.Messages) != 1 {
					t.Errorf("messages %+v", r.Messages)
				}
			}},
		{name: "messages empty", api: Messages, body: `{"model":"c","messages":[]}`, wantErr: true},
		{name: "messages no model", api: Messages, body: `{"messages":[{"role":"user","content":"x"}]}`, wantErr: true},
		{name: "messages bad system", api: Messages, body: `{"model":"c","system":7,"messages":[{"role":"user","content":"x"}]}`, wantErr: true},
		{name: "generate", api: Generate, body: `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":9},"stream":true}`,
			check: func(t *testing.T, r *Request) {
				if r.Model != "" || len(r.PromptTokenIDs) != 3 || r.MaxTokens != 9 || !r.Stream || r.PromptText() != "" {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "generate with model", api: Generate, body: `{"model":"m","token_ids":[5]}`,
			check: func(t *testing.T, r *Request) {
				if r.Model != "m" {
					t.Errorf("model %q", r.Model)
				}
			}},
		{name: "generate empty", api: Generate, body: `{"token_ids":[]}`, wantErr: true},
		{name: "generate text", api: Generate, body: `{"token_ids":"hello"}`, wantErr: true},
		{name: "generate negative", api: Generate, body: `{"token_ids":[1],"sampling_params":{"max_tokens":-1}}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(tt.api, []byte(tt.body))
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidRequest) {
					t.Fatalf("err = %v, want ErrInvalidRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestWithModel(t *testing.T) {
	r, err := Parse(ChatCompletions, []byte(`{"model":"a","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.WithModel("b")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Parse(ChatCompletions, b)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Model != "b" || r2.Messages[0].Text() != "hi" || string(r2.fields["temperature"]) != "0.5" {
		t.Errorf("rewritten body %s", b)
	}
}

func TestWithModelKeepsBytes(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model": "a", "prompt" : [1, 2]}`, `{"model": "b", "prompt" : [1, 2]}`},
		{"{\n  \"prompt\": \"p\",\n  \"model\":\"a\"\n}", "{\n  \"prompt\": \"p\",\n  \"model\":\"b\"\n}"},
		{`{"model":"a","prompt":"p","model":"c"}`, `{"model":"b","prompt":"p","model":"b"}`},
		{`{"mod\u0065l":"a","prompt":"{\"model\":1}"}`, `{"mod\u0065l":"b","prompt":"{\"model\":1}"}`},
	}
	for _, tt := range tests {
		r, err := Parse(Completions, []byte(tt.in))
		if err != nil {
			t.Fatalf("%s: %v", tt.in, err)
		}
		got, err := r.WithModel("b")
		if err != nil || string(got) != tt.want {
			t.Errorf("WithModel(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","prompt":[[1,2],[3]],"max_tokens":1}`,
		`{"model":"m","prompt":["a"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","input":[{"type":"text","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m"}]`, `null`, `{`, ``,
		`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"token_ids":[1,2],"sampling_params":{"max_tokens":3}}`, ` {}`,
	} {
		for _, api := range []API{Completions, ChatCompletions, Responses, Embeddings, Messages, Generate} {
			f.Add(string(api), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, api string, body []byte) {
		r, err := Parse(API(api), body)
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		if r.Model == "" && r.API != Generate {
			t.Fatal("accepted a request without a model")
		}
		_ = r.PromptText()
		b, err := r.WithModel("other")
		if err != nil {
			t.Fatalf("WithModel: %v", err)
		}
		if !json.Valid(b) {
			t.Fatalf("WithModel produced invalid JSON %q", b)
		}
		r2, err := Parse(API(api), b)
		if err != nil {
			t.Fatalf("rewritten body does not parse: %v", err)
		}
		if r2.Model != "other" {
			t.Fatalf("model = %q", r2.Model)
		}
		for k, v := range r.fields {
			if k != "model" && !bytes.Equal(v, r2.fields[k]) {
				t.Fatalf("field %q changed from %s to %s", k, v, r2.fields[k])
			}
		}
	})
}

// BenchmarkParse parses a chat request with a 200 KB prompt, the size at
// which published EPPs flatten out.
func BenchmarkParse(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` +
		strings.Repeat("lorem ipsum ", 200_000/12) + `"}]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := Parse(ChatCompletions, body)
		if err != nil || len(r.Messages) != 2 {
			b.Fatal(err)
		}
	}
}

// A conversation hashes the same through either chat API.
func TestPromptTextAcrossChatAPIs(t *testing.T) {
	chat, err := Parse(ChatCompletions, []byte(`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := Parse(Messages, []byte(`{"model":"m","system":"S","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if chat.PromptText() != msgs.PromptText() {
		t.Errorf("chat %q and messages %q render differently", chat.PromptText(), msgs.PromptText())
	}
}

// WithModel adds a model to a body without one, and an envelope wraps the
// rewritten body.
func TestWithModelNative(t *testing.T) {
	for body, want := range map[string]string{
		`{"token_ids":[1]}`:   `{"model":"x","token_ids":[1]}`,
		` { "token_ids":[1]}`: ` {"model":"x", "token_ids":[1]}`,
	} {
		r, err := Parse(Generate, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.WithModel("x")
		if err != nil || string(got) != want {
			t.Errorf("%s: %s %v, want %s", body, got, err, want)
		}
	}
	r, err := Parse(ChatCompletions, []byte(`{"model":"a","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r.Wrap(func(inner []byte) ([]byte, error) { return append([]byte("<"), append(inner, '>')...), nil })
	got, err := r.WithModel("b")
	if err != nil || string(got) != `<{"model":"b","messages":[{"role":"user","content":"x"}]}>` {
		t.Errorf("wrapped %s %v", got, err)
	}
}
