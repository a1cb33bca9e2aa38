package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// API names the OpenAI endpoint a request was sent to.
type API string

// The APIs the picker understands, keyed by the tail of :path.
const (
	Completions     API = "completions"
	ChatCompletions API = "chat/completions"
	Responses       API = "responses"
	Embeddings      API = "embeddings"
)

// APIFromPath maps a request path to its API; ok is false for anything else.
// The query string is ignored.
func APIFromPath(path string) (api API, ok bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimRight(path, "/")
	for _, a := range []API{ChatCompletions, Completions, Responses, Embeddings} {
		if strings.HasSuffix(path, "/"+string(a)) {
			return a, true
		}
	}
	return "", false
}

// ErrInvalidRequest is wrapped by every parse error: the body is not a
// routable request, and the client gets a 400.
var ErrInvalidRequest = errors.New("invalid request")

// Message is one chat message. Content keeps its JSON form (a string or an
// array of parts) so that prompt text can be rendered either way.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content,omitempty"`
}

// Text returns the message's text: the string content, or the text parts of
// an array content joined by newlines.
func (m Message) Text() string {
	return contentText(m.Content)
}

// Request is the routing-relevant view of an OpenAI request body.
type Request struct {
	API    API
	Model  string
	Stream bool
	// IncludeUsage is stream_options.include_usage.
	IncludeUsage bool
	// Prompt is the completions prompt as text (an array of strings is
	// joined; token-id prompts leave it empty and set PromptTokenIDs).
	Prompt         string
	PromptTokenIDs []int
	Messages       []Message
	// Input is the responses/embeddings input rendered as text.
	Input string
	// MaxTokens is the output bound: max_completion_tokens, else
	// max_tokens, else max_output_tokens (0 when none). vLLM's chat API
	// takes max_completion_tokens over the deprecated max_tokens when a
	// client sends both, so the picker's output estimate and the
	// simulator's length read this one field.
	MaxTokens int
	CacheSalt string

	fields map[string]json.RawMessage
	body   []byte // the parsed body, for WithModel
	// wrap, when set, packs WithModel's result into its envelope (Wrap).
	wrap func(inner []byte) ([]byte, error)
	// chatText caches PromptText for chat requests.
	chatText *string
}

// Parse decodes body as a request to api. Errors wrap ErrInvalidRequest.
// The Request keeps body for WithModel: the caller must not modify it.
func Parse(api API, body []byte) (*Request, error) {
	// json.Unmarshal rejects trailing data (a Decoder would accept a
	// stray "]" after the object) and bounds nesting depth.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %v", ErrInvalidRequest, err)
	}
	if fields == nil {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
	}
	r := &Request{API: api, fields: fields, body: body}
	if err := r.decode(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Request) decode() error {
	if err := r.field("model", &r.Model); err != nil {
		return err
	}
	if r.Model == "" && r.API != Generate && r.API != VLLMGRPC {
		return fmt.Errorf("%w: model not found in request body", ErrInvalidRequest)
	}
	if err := r.field("stream", &r.Stream); err != nil {
		return err
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	if err := r.field("stream_options", &so); err != nil {
		return err
	}
	r.IncludeUsage = so.IncludeUsage
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		var n *int
		if err := r.field(k, &n); err != nil {
			return err
		}
		if n != nil {
			if *n < 0 {
				return fmt.Errorf("%w: %s must be non-negative", ErrInvalidRequest, k)
			}
			r.MaxTokens = *n
			break
		}
	}
	if err := r.field("cache_salt", &r.CacheSalt); err != nil {
		return err
	}
	switch r.API {
	case Completions:
		return r.decodePrompt()
	case ChatCompletions:
		if err := r.field("messages", &r.Messages); err != nil {
			return err
		}
		if len(r.Messages) == 0 {
			return fmt.Errorf("%w: messages must contain at least one message", ErrInvalidRequest)
		}
	case Messages:
		return r.decodeMessages()
	case Generate:
		return r.decodeGenerate()
	case VLLMGRPC:
		return r.decodeGRPC()
	case Responses, Embeddings:
		raw, ok := r.fields["input"]
		if !ok {
			return fmt.Errorf("%w: input is required", ErrInvalidRequest)
		}
		r.Input = contentText(raw)
		if r.Input == "" {
			return fmt.Errorf("%w: input must not be empty", ErrInvalidRequest)
		}
	}
	return nil
}

func (r *Request) decodePrompt() error {
	raw, ok := r.fields["prompt"]
	if !ok {
		return fmt.Errorf("%w: prompt is required", ErrInvalidRequest)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		r.Prompt = s
	} else {
		var ss []string
		var ids []int
		var batch [][]int
		switch {
		case json.Unmarshal(raw, &ss) == nil:
			r.Prompt = strings.Join(ss, "")
		case json.Unmarshal(raw, &ids) == nil:
			r.PromptTokenIDs = ids
		case json.Unmarshal(raw, &batch) == nil:
			// A batch of token-id prompts routes as one prompt: the
			// concatenation is what a shared prefix would be matched on.
			for _, b := range batch {
				r.PromptTokenIDs = append(r.PromptTokenIDs, b...)
			}
		default:
			return fmt.Errorf("%w: prompt must be a string, an array of strings, an array of token ids or an array of such arrays", ErrInvalidRequest)
		}
	}
	if r.Prompt == "" && len(r.PromptTokenIDs) == 0 {
		return fmt.Errorf("%w: prompt must not be empty", ErrInvalidRequest)
	}
	return nil
}

// field decodes one optional top-level field into v.
func (r *Request) field(name string, v any) error {
	raw, ok := r.fields[name]
	if !ok || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%w: field %q: %v", ErrInvalidRequest, name, err)
	}
	return nil
}

// PromptText is the text a prefix hash is computed over when no tokenizer is
// used: the prompt, the responses/embeddings input, or, for chat and
// Anthropic messages, the messages as compact JSON (role and content), so
// that every turn counts. A generate request's prompt is its token ids
// (PromptTokenIDs), and its text is empty.
//
// The chat rendering is computed once and kept: the picker estimates the
// prompt's length and hashes its prefix from the same text. A Request is
// used by one goroutine at a time.
func (r *Request) PromptText() string {
	switch r.API {
	case ChatCompletions, Messages:
		if r.chatText == nil {
			b, _ := json.Marshal(r.Messages)
			s := string(b)
			r.chatText = &s
		}
		return *r.chatText
	case Completions, VLLMGRPC:
		return r.Prompt
	case Generate:
		return ""
	default:
		return r.Input
	}
}

// WithModel returns the body with the top-level model replaced. Every other
// byte is kept as the client sent it, so that the model server sees the
// request it was sent, and a large prompt is copied once, not re-encoded.
func (r *Request) WithModel(model string) ([]byte, error) {
	return r.With(Field{Key: "model", Value: model})
}

// Field is one top-level member of a body rewrite.
type Field struct {
	Key   string
	Value any // JSON-encoded into the body
}

// With returns the body with each field's top-level value replaced (every
// duplicate of it), or added first when the body has none, keeping every
// other byte as WithModel does. An envelope (Wrap) is rebuilt around the
// result once.
func (r *Request) With(fields ...Field) ([]byte, error) {
	out := r.body
	for _, f := range fields {
		v, err := json.Marshal(f.Value)
		if err != nil {
			return nil, err
		}
		if out, err = setTopLevel(out, f.Key, v); err != nil {
			return nil, err
		}
	}
	if r.wrap != nil {
		return r.wrap(out)
	}
	return out, nil
}

// setTopLevel is body with key's top-level values replaced by v, or with
// key: v added first; body is left as it is.
func setTopLevel(body []byte, key string, v []byte) ([]byte, error) {
	k, err := json.Marshal(key)
	if err != nil {
		return nil, err
	}
	spans, err := topLevelValues(body, key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+len(v)+len(k)+2)
	prev := 0
	if len(spans) == 0 {
		i := skipSpace(body, 0) + 1
		out = append(append(append(append(out, body[:i]...), k...), ':'), v...)
		if j := skipSpace(body, i); j < len(body) && body[j] != '}' {
			out = append(out, ',')
		}
		prev = i
	}
	for _, sp := range spans {
		out = append(out, body[prev:sp[0]]...)
		out = append(out, v...)
		prev = sp[1]
	}
	return append(out, body[prev:]...), nil
}

// topLevelValues returns the [start, end) byte spans of every value of key
// in the JSON object body (duplicates included: decoders disagree on which
// one wins, so a rewrite must replace them all). body must be valid JSON, as
// Parse has checked.
func topLevelValues(body []byte, key string) ([][2]int, error) {
	var spans [][2]int
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
	}
	i++
	for {
		i = skipSpace(body, i)
		if i >= len(body) {
			return nil, fmt.Errorf("%w: unterminated object", ErrInvalidRequest)
		}
		switch body[i] {
		case '}':
			return spans, nil
		case ',':
			i++
			continue
		}
		kEnd := skipValue(body, i)
		var k string
		if json.Unmarshal(body[i:kEnd], &k) != nil {
			return nil, fmt.Errorf("%w: bad object key", ErrInvalidRequest)
		}
		i = skipSpace(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return nil, fmt.Errorf("%w: missing colon", ErrInvalidRequest)
		}
		start := skipSpace(body, i+1)
		i = skipValue(body, start)
		if k == key {
			spans = append(spans, [2]int{start, i})
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	inString := false
	for ; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
				if depth == 0 {
					return i + 1
				}
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of a scalar, at its container's close
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return len(b)
}

func contentText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for i, p := range parts {
			if i > 0 {
				b.WriteByte('\n')
			}
			if p.Text != "" {
				b.WriteString(p.Text)
			} else if len(p.Content) > 0 {
				b.WriteString(contentText(p.Content))
			}
		}
		return b.String()
	}
	return string(raw)
}

// RawField is a top-level field of the body as the client sent it; nil when
// absent. Callers must not modify it.
func (r *Request) RawField(name string) json.RawMessage { return r.fields[name] }
