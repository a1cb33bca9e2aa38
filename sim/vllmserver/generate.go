package vllmserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/sim/engine"
)

type apiKind uint8

const (
	apiCompletions apiKind = iota
	apiChat
)

// job is one validated generation request, ready for the engine.
type job struct {
	kind         apiKind
	id           string
	model        string
	created      int64
	stream       bool
	includeUsage bool
	prompt       []int
	maxTokens    int   // what the client asked for (or the default)
	echo         []int // echo mode: the tokens to answer with
	lora         string
	cacheSalt    string
	prefillOnly  bool
	priority     int // vLLM's request priority: lower is scheduled first
	remote       *engine.RemotePrefill
	kv           *vllm.KVTransferParams // the request's, for the decode leg's release
	mm           []kvhash.MMItem        // the prompt's multimodal items
	parts        []prompt.MMPart
	ecIn         map[string]json.RawMessage // ec_transfer_params: encoder outputs computed elsewhere
	ecOut        map[string]ecParams        // an encode server's answer
	// threshold is the request's cache_hit_threshold: the least fraction
	// of the prompt that must be cached (locally or by the KV connector)
	// for the request to run; nil for none.
	threshold *float64
	tool      *forcedTool // chat: the tool call tool_choice forces
}

// engineMaxTokens is what the engine generates: in echo mode no more than
// there is to echo.
func (j *job) engineMaxTokens() int {
	if j.echo != nil {
		return max(1, min(j.maxTokens, len(j.echo)))
	}
	return j.maxTokens
}

// finishReason is "stop" when an echo ended before max_tokens, as a model
// that emitted EOS would; otherwise the engine's.
func (j *job) finishReason(fin *engine.Finished) string {
	if j.echo != nil && len(j.echo) < j.maxTokens {
		return "stop"
	}
	return fin.Reason
}

// textTokens maps the engine's output tokens [from, from+n) to the tokens
// the response shows.
func (j *job) textTokens(out []int, from int) []int {
	if j.echo == nil {
		return out
	}
	return j.echo[from:min(from+len(out), len(j.echo))]
}

// generate serves /v1/completions and /v1/chat/completions.
func (s *Server) generate(kind apiKind) http.HandlerFunc {
	return s.method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxRequestBodyBytes))
		if err != nil {
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				writeError(w, newAPIError(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", mbe.Limit))
				return
			}
			writeError(w, badRequest("reading the request body: %v", err))
			return
		}
		j, aerr := s.prepare(kind, body)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		s.serve(r.Context(), w, j)
	})
}

// prepare validates a body and tokenizes its prompt.
func (s *Server) prepare(kind apiKind, body []byte) (*job, *apiError) {
	api := openai.Completions
	if kind == apiChat {
		api = openai.ChatCompletions
	}
	req, err := openai.Parse(api, body)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	// The shared parser keeps only routing fields; the P/D fields are
	// decoded here.
	var ext struct {
		KV        *vllm.KVTransferParams     `json:"kv_transfer_params"`
		EC        map[string]json.RawMessage `json:"ec_transfer_params"`
		Threshold *float64                   `json:"cache_hit_threshold"`
		Tools     []toolSpec                 `json:"tools"`
	}
	if err := json.Unmarshal(body, &ext); err != nil {
		return nil, badRequest("kv_transfer_params: %v", err)
	}
	lora, ok := s.models.resolve(req.Model)
	if !ok {
		return nil, newAPIError(http.StatusNotFound, "The model `%s` does not exist.", req.Model)
	}
	if t := ext.Threshold; t != nil && !(*t >= 0 && *t <= 1) {
		return nil, badRequest("cache_hit_threshold %v must be within [0, 1]", *t)
	}
	j := &job{kind: kind, model: req.Model, created: time.Now().Unix(), stream: req.Stream,
		includeUsage: req.Stream && req.IncludeUsage, lora: lora, cacheSalt: req.CacheSalt, kv: ext.KV, ecIn: ext.EC,
		threshold: ext.Threshold}
	if j.priority, err = requestPriority(req.RawField("priority")); err != nil {
		return nil, badRequest("%v", err)
	}
	if j.priority != 0 && s.engCfg.SchedulingPolicy != engine.SchedulingPriority {
		// vLLM's engine refuses it the same way (a ValueError, answered 400).
		return nil, badRequest("Got priority %d but Priority scheduling is not enabled.", j.priority)
	}
	j.parts = prompt.MMParts(req)
	if s.opts.Role == RoleEncode && len(j.parts) == 0 {
		return nil, badRequest("this server's role is encode; it serves chat requests with image_url, audio_url, video_url or input_audio parts")
	}
	var aerr *apiError
	if aerr = s.applyTransfer(j); aerr != nil {
		return nil, aerr
	}
	if s.injectFailure() {
		return nil, newAPIError(http.StatusInternalServerError, "injected failure (--failure-rate %v)", s.opts.FailureRate)
	}

	if kind == apiChat {
		if j.tool, aerr = s.forcedToolOf(ext.Tools, req.RawField("tool_choice")); aerr != nil {
			return nil, aerr
		}
		j.id = s.newID("chatcmpl")
	} else {
		j.id = s.newID("cmpl")
		vocab := s.tok.VocabSize()
		for _, id := range req.PromptTokenIDs {
			if id < 0 || id >= vocab {
				return nil, badRequest("Token id %d is out of vocabulary", id)
			}
		}
	}
	// The same rendering the picker's precise scorer does, so that both
	// compute the same block hashes.
	if j.prompt, j.mm, err = prompt.TokensMM(s.enc, s.tok, req, s.opts.MMTokensPerItem); err != nil {
		return nil, badRequest("%v", err)
	}
	if len(j.prompt) == 0 {
		return nil, badRequest("The prompt is empty after tokenization")
	}
	if s.opts.Echo {
		j.echo = j.prompt
		if kind == apiChat {
			j.echo = s.tok.Encode(req.Messages[len(req.Messages)-1].Text())
		}
	}
	j.maxTokens = req.MaxTokens
	if j.maxTokens == 0 {
		// Left over context, as vLLM does, capped by the default; a prompt
		// that leaves none still asks for one token and is refused below.
		j.maxTokens = max(1, min(s.opts.DefaultMaxTokens, s.engCfg.MaxModelLen-len(j.prompt)))
	}
	if j.prefillOnly {
		j.maxTokens = 1
	}
	return j, nil
}

// serve hands a job to the engine and writes its response.
func (s *Server) serve(ctx context.Context, w http.ResponseWriter, j *job) {
	arrival := s.runner.Now()
	if aerr := s.encodeItems(ctx, j); aerr != nil {
		writeError(w, aerr)
		return
	}
	if s.dp != nil {
		if aerr := s.dp.beforeSubmit(ctx, j); aerr != nil {
			s.refuse(w, j, aerr)
			return
		}
	}
	if s.kvc != nil {
		if aerr := s.kvc.load(ctx, j); aerr != nil {
			s.refuse(w, j, aerr)
			return
		}
	}
	if j.threshold != nil && *j.threshold > 0 {
		if cached, ok := s.meetsThreshold(j); !ok {
			s.thresholdMiss(w, j, cached)
			return
		}
	}
	st, err := s.runner.Submit(engine.Request{
		ID: j.id, Prompt: j.prompt, MaxTokens: j.engineMaxTokens(), LoRA: j.lora, CacheSalt: j.cacheSalt,
		PrefillOnly: j.prefillOnly, RemotePrefill: j.remote, MM: j.mm, Priority: j.priority,
	})
	if err != nil {
		writeError(w, s.engineError(err, len(j.prompt), j.maxTokens))
		return
	}
	rec := s.metrics.newRecorder(arrival, j.maxTokens)
	var out outputWriter
	if j.stream {
		// Headers go out at once, as Starlette's StreamingResponse sends
		// them, before the first token.
		sw := newSSEWriter(s, w, j)
		if err := sw.start(); err != nil {
			s.abort(j.id)
			return
		}
		out = sw
	} else {
		out = &jsonWriter{s: s, w: w, j: j}
	}
	n := 0
	for {
		toks, fin, err := st.Next(ctx)
		if err != nil {
			s.abort(j.id) // the client went away or the server is closing
			return
		}
		now := s.runner.Now()
		if len(toks) > 0 {
			if n == 0 {
				s.releaseRemote(j.kv)
			}
			rec.tokens(now, len(toks))
			if err := out.tokens(j.textTokens(toks, n)); err != nil {
				s.abort(j.id)
				return
			}
			n += len(toks)
		}
		if fin == nil {
			continue
		}
		if fin.Reason == engine.FinishAbort {
			// Aborted by someone other than this handler; a stream just ends.
			if !j.stream {
				writeError(w, newAPIError(http.StatusInternalServerError, "request %s was aborted", j.id))
			}
			return
		}
		if s.kvc != nil {
			s.kvc.store(j)
		}
		reason := j.finishReason(fin)
		rec.finish(now, reason, fin)
		_ = out.finish(fin, reason, s.transferParams(j, fin))
		return
	}
}

// refuse answers a request the engine will not run. A failure vLLM meets
// while generating (inStream) reaches a stream after its headers and first
// chunk, as an error event; anything else is the response.
func (s *Server) refuse(w http.ResponseWriter, j *job, e *apiError) {
	if !j.stream || !e.inStream {
		writeError(w, e)
		return
	}
	sw := newSSEWriter(s, w, j)
	if sw.start() == nil {
		_ = sw.fail(e)
	}
}

// abort drops a request whose response nobody will read; the engine may
// already have finished it.
func (s *Server) abort(id string) {
	if err := s.runner.Abort(id); err == nil {
		s.log.Debug("request aborted", "id", id)
	}
}

// outputWriter renders the engine's tokens as a response.
type outputWriter interface {
	// tokens receives the new tokens of the response text.
	tokens(ids []int) error
	finish(fin *engine.Finished, reason string, kv *vllm.KVTransferParams) error
}

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(u engine.Usage) *usage {
	return &usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		TotalTokens: u.PromptTokens + u.CompletionTokens, PromptTokensDetails: promptDetails{CachedTokens: u.CachedTokens}}
}

type message struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// choice is a completions or chat choice; the fields of the other API are
// left nil and omitted.
type choice struct {
	Index        int      `json:"index"`
	Text         *string  `json:"text,omitempty"`
	Message      *message `json:"message,omitempty"`
	Delta        *message `json:"delta,omitempty"`
	Logprobs     any      `json:"logprobs"`
	FinishReason *string  `json:"finish_reason"`
	StopReason   any      `json:"stop_reason"`
}

type response struct {
	ID               string                 `json:"id"`
	Object           string                 `json:"object"`
	Created          int64                  `json:"created"`
	Model            string                 `json:"model"`
	Choices          []choice               `json:"choices"`
	Usage            *usage                 `json:"usage,omitempty"`
	KVTransferParams *vllm.KVTransferParams `json:"kv_transfer_params,omitempty"`
	ECTransferParams map[string]ecParams    `json:"ec_transfer_params,omitempty"`
}

// jsonWriter collects the tokens and writes one JSON response.
type jsonWriter struct {
	s   *Server
	w   http.ResponseWriter
	j   *job
	ids []int
}

func (o *jsonWriter) tokens(ids []int) error {
	o.ids = append(o.ids, ids...)
	return nil
}

func (o *jsonWriter) finish(fin *engine.Finished, reason string, kv *vllm.KVTransferParams) error {
	text := o.s.tok.Decode(o.ids)
	c := choice{FinishReason: &reason}
	resp := response{ID: o.j.id, Created: o.j.created, Model: o.j.model, Usage: usageOf(fin.Usage), KVTransferParams: kv, ECTransferParams: o.j.ecOut}
	if o.j.kind == apiChat {
		resp.Object = "chat.completion"
		c.Message = &message{Role: "assistant", Content: &text}
		if t := o.j.tool; t != nil {
			// vLLM answers a forced call with empty content and the call.
			empty := ""
			c.Message = &message{Role: "assistant", Content: &empty, ToolCalls: []toolCall{t.call}}
			reason = t.finishReason(reason)
		}
	} else {
		resp.Object = "text_completion"
		c.Text = &text
	}
	resp.Choices = []choice{c}
	writeJSON(o.w, http.StatusOK, resp)
	return nil
}

// FinishCacheThreshold is the finish_reason of a request that
// cache_hit_threshold turned away: too little of its prompt was cached.
const FinishCacheThreshold = "cache_threshold"

// meetsThreshold reports whether enough of j's prompt is cached — by the
// prefix cache or by what the KV connector loaded — for its
// cache_hit_threshold, and how many tokens are.
func (s *Server) meetsThreshold(j *job) (int, bool) {
	cached := s.runner.CachedTokens(j.prompt, kvhash.Extra{LoRA: j.lora, CacheSalt: j.cacheSalt, MM: j.mm})
	if j.remote != nil {
		cached = max(cached, min(j.remote.Tokens, len(j.prompt)-1))
	}
	return cached, float64(cached) >= *j.threshold*float64(len(j.prompt))
}

// thresholdMiss answers a request below its cache_hit_threshold at once,
// generating nothing: finish_reason "cache_threshold", for the sidecar's
// shared-storage connector to prefill elsewhere and ask again.
func (s *Server) thresholdMiss(w http.ResponseWriter, j *job, cached int) {
	if s.kvc != nil {
		s.kvc.stats.ThresholdMisses.Add(1)
	}
	fin := &engine.Finished{ID: j.id, Reason: FinishCacheThreshold,
		Usage: engine.Usage{PromptTokens: len(j.prompt), CachedTokens: cached}}
	var out outputWriter = &jsonWriter{s: s, w: w, j: j}
	if j.stream {
		sw := newSSEWriter(s, w, j)
		if sw.start() != nil {
			return
		}
		out = sw
	}
	_ = out.finish(fin, FinishCacheThreshold, nil)
}
