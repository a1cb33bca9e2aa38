package tokenproducer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "token-producer"

// llm-d's defaults and render paths.
const (
	DefaultURL         = "http://localhost:8000"
	DefaultTimeout     = 5 * time.Second
	DefaultMMTimeout   = 30 * time.Second
	CompletionsRender  = "/v1/completions/render"
	ChatRender         = "/v1/chat/completions/render"
	maxRenderBodyBytes = 64 << 20
)

// Params are the plugin's parameters.
type Params struct {
	ModelName          string          `json:"modelName"`
	VLLM               *VLLM           `json:"vllm"`
	Estimate           *Estimate       `json:"estimate"`
	UDSTokenizerConfig json.RawMessage `json:"udsTokenizerConfig"`
}

// VLLM is the render backend's configuration.
type VLLM struct {
	URL       string            `json:"url"`
	HTTP      string            `json:"http"`
	Timeout   duration.Duration `json:"timeout"`
	MMTimeout duration.Duration `json:"mmTimeout"`
}

// Producer implements token-producer.
type Producer struct {
	scheduling.Named
	// estimate, when set, is the backend; else the vLLM render.
	estimate           *estimator
	model              string
	base               string
	timeout, mmTimeout time.Duration
	client             *http.Client
	log                *slog.Logger
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	// null is absent, as for every other parameter.
	p.UDSTokenizerConfig = nonNull(p.UDSTokenizerConfig)
	vllm := p.VLLM != nil || p.ModelName != ""
	switch {
	case len(p.UDSTokenizerConfig) > 0:
		return nil, &scheduling.UnsupportedParameterError{Param: "udsTokenizerConfig", Reason: "the deprecated UDS tokenizer backend; use vllm.url (a vLLM render endpoint)"}
	case p.Estimate != nil && vllm:
		return nil, errors.New("parameters: give one backend, estimate or vllm (modelName selects vllm), not both")
	case !vllm:
		// llm-d's default backend: no model, no service.
		est, err := newEstimator(cmp.Or(p.Estimate, &Estimate{}))
		if err != nil {
			return nil, err
		}
		return &Producer{Named: scheduling.NewNamed(Type, name), estimate: est, log: logger(h)}, nil
	case p.ModelName == "":
		return nil, errors.New("parameters.modelName is required by the vllm backend")
	}
	v := p.VLLM
	if v == nil {
		v = &VLLM{}
	}
	if v.URL != "" && v.HTTP != "" {
		return nil, errors.New("parameters.vllm: give url or its older name http, not both")
	}
	base := strings.TrimRight(v.URL+v.HTTP, "/")
	if base == "" {
		base = DefaultURL
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("parameters.vllm.url %q: want http://host[:port] (llm-d's render backend speaks plain HTTP)", base)
	}
	pr := &Producer{Named: scheduling.NewNamed(Type, name), model: p.ModelName, base: base,
		timeout: time.Duration(v.Timeout), mmTimeout: time.Duration(v.MMTimeout), log: logger(h)}
	if pr.timeout == 0 {
		pr.timeout = DefaultTimeout
	}
	if pr.mmTimeout == 0 {
		pr.mmTimeout = DefaultMMTimeout
	}
	if pr.timeout < 0 || pr.mmTimeout < 0 {
		return nil, errors.New("parameters.vllm: timeouts must be positive")
	}
	pr.client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	return pr, nil
}

func logger(h *scheduling.Handle) *slog.Logger {
	if h != nil && h.Log != nil {
		return h.Log
	}
	return slog.Default()
}

func nonNull(raw json.RawMessage) json.RawMessage {
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	return raw
}

// Produces implements scheduling.DataDependencies.
func (p *Producer) Produces() []string { return []string{prefixmatch.TokensKey.String()} }

// Consumes implements scheduling.DataDependencies.
func (p *Producer) Consumes() []string { return nil }

// Produce implements scheduling.DataProducer: the tokens go to
// prefixmatch.TokensKey and their count becomes the request's prompt
// length, which the load, latency and P/D plugins read.
func (p *Producer) Produce(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, _ []*endpoints.Endpoint) {
	if req.Body == nil {
		return
	}
	var tokens []int
	var err error
	if p.estimate != nil {
		tokens, err = p.estimate.Estimate(req.Body, req.Headers)
	} else {
		tokens, err = p.Render(ctx, req.Body)
	}
	if err != nil {
		p.log.Debug("token-producer: no tokens; the prefix matchers use the prompt text", "err", err)
		return
	}
	if len(tokens) == 0 {
		return
	}
	req.PromptTokens = len(tokens)
	scheduling.Write(cs, prefixmatch.TokensKey, &tokens)
}

// PreRequest implements scheduling.PreRequest: the decision drops the
// tokens. Their readers are the matchers' Produce and Score, none of them
// a hook that runs later, and the cycle state lives until the response
// ends: a streaming response would otherwise keep 8 bytes a token (twice
// the prompt's size for estimated tokens, the client's token-id array
// with the body already dropped) for its whole decode. Their count stays
// in the request's PromptTokens.
func (p *Producer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Result) {
	if tokens, ok := scheduling.Read(cs, prefixmatch.TokensKey); ok && tokens != nil {
		*tokens = nil
	}
}

// renderResponse is one render result.
type renderResponse struct {
	TokenIDs []int `json:"token_ids"`
}

// chatFields are forwarded to the chat render as the client sent them.
var chatFields = []string{"messages", "tools", "documents", "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"}

// Render returns body's prompt tokens from the render endpoint.
func (p *Producer) Render(ctx context.Context, body *openai.Request) ([]int, error) {
	if len(body.PromptTokenIDs) > 0 {
		return body.PromptTokenIDs, nil
	}
	payload := map[string]json.RawMessage{}
	model, _ := json.Marshal(p.model)
	payload["model"] = model
	path, timeout := "", p.timeout
	switch body.API {
	case openai.Completions:
		path = CompletionsRender
		payload["prompt"] = body.RawField("prompt")
	case openai.ChatCompletions:
		path = ChatRender
		for _, f := range chatFields {
			if v := body.RawField(f); v != nil {
				payload[f] = v
			}
		}
		if multimodal(body.RawField("messages")) {
			timeout = p.mmTimeout
		}
	default:
		return nil, fmt.Errorf("no render endpoint for %s requests", body.API)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxRenderBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("render: HTTP %s: %.200s", resp.Status, data)
	}
	if len(data) > maxRenderBodyBytes {
		return nil, fmt.Errorf("render: response larger than %d bytes", maxRenderBodyBytes)
	}
	return decodeRender(path, data)
}

// decodeRender reads a render response: the completions render answers one
// result per prompt (a single prompt is one element), the chat render one
// result.
func decodeRender(path string, data []byte) ([]int, error) {
	var r renderResponse
	if path == CompletionsRender {
		var rs []renderResponse
		if err := json.Unmarshal(data, &rs); err != nil {
			return nil, fmt.Errorf("render response: %w", err)
		}
		if len(rs) != 1 {
			return nil, fmt.Errorf("render response: %d results for one prompt", len(rs))
		}
		r = rs[0]
	} else if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("render response: %w", err)
	}
	if len(r.TokenIDs) == 0 {
		return nil, errors.New("render response: no token_ids")
	}
	for _, t := range r.TokenIDs {
		if t < 0 {
			return nil, fmt.Errorf("render response: negative token id %d", t)
		}
	}
	return r.TokenIDs, nil
}

// multimodal reports whether chat messages carry image, audio or video
// parts (llm-d's mmTimeout applies).
func multimodal(messages json.RawMessage) bool {
	for _, k := range []string{`"image_url"`, `"input_audio"`, `"audio_url"`, `"video_url"`} {
		if bytes.Contains(messages, []byte(k)) {
			return true
		}
	}
	return false
}

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
)
