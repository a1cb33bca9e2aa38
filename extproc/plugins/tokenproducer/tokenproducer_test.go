package tokenproducer

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// renderServer answers vLLM's render endpoints with the real Qwen3
// tokenizer and chat template (internal/tokenizer), over loopback.
type renderServer struct {
	*httptest.Server
	lastModel atomic.Value
	status    atomic.Int32
	delay     atomic.Int64
}

// loadTokenizer loads the tokenizer once for all tests: loading it costs
// seconds under -race.
var loadTokenizer = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.Load(tokenizerDir)
})

var tokenizerDir string

func qwen(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tokenizerDir = testutil.TokenizerDir(t)
	tok, err := loadTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func newRenderServer(t *testing.T) *renderServer {
	t.Helper()
	tok := qwen(t)
	rs := &renderServer{}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := time.Duration(rs.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		if s := rs.status.Load(); s != 0 {
			http.Error(w, "engine down", int(s))
			return
		}
		api := map[string]openai.API{CompletionsRender: openai.Completions, ChatRender: openai.ChatCompletions}[r.URL.Path]
		body, _ := io.ReadAll(r.Body)
		req, err := openai.Parse(api, body)
		if err != nil || r.Method != http.MethodPost {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		rs.lastModel.Store(req.Model)
		ids, err := prompt.Tokens(tok, tok, req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var out any = map[string]any{"token_ids": ids}
		if api == openai.Completions {
			out = []any{out}
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(rs.Close)
	return rs
}

func producer(t *testing.T, params string) *Producer {
	t.Helper()
	p, err := New("", []byte(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Producer)
}

// The tokens the producer leaves are what the model server's tokenizer and
// chat template make of the prompt.
func TestRenderTokens(t *testing.T) {
	rs := newRenderServer(t)
	tok := qwen(t)
	p := producer(t, `{"modelName": "Qwen/Qwen3-0.6B", "vllm": {"url": "`+rs.URL+`/"}}`)
	for api, body := range map[openai.API]string{
		openai.Completions:     `{"model":"m","prompt":"The capital of France is"}`,
		openai.ChatCompletions: `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}]}`,
	} {
		req, err := openai.Parse(api, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		want, err := prompt.Tokens(tok, tok, req)
		if err != nil {
			t.Fatal(err)
		}
		cs := scheduling.NewCycleState()
		p.Produce(context.Background(), cs, &scheduling.Request{Body: req}, nil)
		got, ok := scheduling.Read(cs, prefixmatch.TokensKey)
		if !ok || len(*got) != len(want) || (*got)[0] != want[0] || (*got)[len(want)-1] != want[len(want)-1] {
			t.Fatalf("%s: tokens %v, want %v", api, got, want)
		}
		if m := rs.lastModel.Load(); m != "Qwen/Qwen3-0.6B" {
			t.Fatalf("render model %v, want modelName", m)
		}
	}
}

// A failed, slow or malformed render leaves no tokens (the precise match
// falls back to its own tokenizer).
func TestRenderFailures(t *testing.T) {
	rs := newRenderServer(t)
	p := producer(t, `{"modelName": "m", "vllm": {"http": "`+rs.URL+`", "timeout": "100ms"}}`)
	req, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	rs.status.Store(http.StatusServiceUnavailable)
	if _, err := p.Render(context.Background(), req); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err = %v", err)
	}
	rs.status.Store(0)
	rs.delay.Store(int64(time.Second))
	cs := scheduling.NewCycleState()
	p.Produce(context.Background(), cs, &scheduling.Request{Body: req}, nil)
	if _, ok := scheduling.Read(cs, prefixmatch.TokensKey); ok {
		t.Fatal("tokens left after a timed-out render")
	}
	for _, bad := range []string{`[]`, `[{"token_ids":[]}]`, `{"token_ids":[1]}`, `[{"token_ids":[-1]}]`, `not json`} {
		if _, err := decodeRender(CompletionsRender, []byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	// A token-id prompt needs no render.
	ids, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":[5,6,7]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p.Render(context.Background(), ids); err != nil || len(got) != 3 {
		t.Fatalf("token prompt: %v %v", got, err)
	}
}

func TestParams(t *testing.T) {
	for params, want := range map[string]string{
		`{"estimate": {}, "modelName": "m"}`:                                  "not both",
		`{"estimate": {"image": {"mode": "fixed"}}}`:                          `"dynamic" or "static"`,
		`{"estimate": {"image": {"dynamic": {"factor": -1}}}}`:                "image.dynamic.factor must not be negative",
		`{"estimate": {"video": {"frames": {"mode": "all"}}}}`:                `"sampled" or "strided"`,
		`{"estimate": {"image": {"size": 3}}}`:                                "unknown field",
		`{"udsTokenizerConfig": {}}`:                                          "udsTokenizerConfig",
		`{"vllm": {"url": "http://x:8000"}}`:                                  "modelName",
		`{"modelName": "m", "vllm": {"url": "https://x"}}`:                    "plain HTTP",
		`{"modelName": "m", "vllm": {"url": "http://a", "http": "http://b"}}`: "not both",
		`{"modelName": "m", "vllm": {"timeout": "-1s"}}`:                      "positive",
		`{"modelName": "m", "vllm": {"grpc": "x"}}`:                           "unknown field",
	} {
		if _, err := New("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
	if p := producer(t, `{"modelName": "m"}`); p.base != DefaultURL || p.timeout != DefaultTimeout || p.mmTimeout != DefaultMMTimeout {
		t.Fatalf("defaults %+v", p)
	}
}

// FuzzDecodeRender: a render answer of either API is its token ids, all
// non-negative and at least one, or an error; never a panic.
func FuzzDecodeRender(f *testing.F) {
	for _, seed := range []struct {
		path, body string
	}{
		{ChatRender, `{"token_ids":[1,2,3]}`},
		{CompletionsRender, `[{"token_ids":[7]}]`},
		{CompletionsRender, `[{"token_ids":[1]},{"token_ids":[2]}]`},
		{ChatRender, `{"token_ids":[-1]}`},
		{ChatRender, `{"token_ids":[1e99]}`},
		{CompletionsRender, `null`},
	} {
		f.Add(seed.path == CompletionsRender, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, completions bool, body []byte) {
		path := ChatRender
		if completions {
			path = CompletionsRender
		}
		ids, err := decodeRender(path, body)
		if err != nil {
			return
		}
		if len(ids) == 0 {
			t.Fatalf("decodeRender(%q) = no ids, no error", body)
		}
		for _, id := range ids {
			if id < 0 {
				t.Fatalf("decodeRender(%q) = negative id %d", body, id)
			}
		}
	})
}
