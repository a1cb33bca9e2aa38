package vllmserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/sim/engine"
)

// maxHeldTokens bounds how many tokens the streaming detokenizer holds back
// waiting for the rest of a UTF-8 character; a byte-level token can end
// mid-character, but no character spans more than four bytes.
const maxHeldTokens = 4

// detokenizer turns a token stream into text deltas without splitting a
// multi-byte character between two chunks.
type detokenizer struct {
	tok     *tokenizer.Tokenizer
	pending []int
}

func (d *detokenizer) push(ids []int) string {
	d.pending = append(d.pending, ids...)
	text := d.tok.Decode(d.pending)
	if strings.HasSuffix(text, "\uFFFD") && len(d.pending) < maxHeldTokens {
		return ""
	}
	d.pending = d.pending[:0]
	return text
}

func (d *detokenizer) flush() string {
	text := d.tok.Decode(d.pending)
	d.pending = d.pending[:0]
	return text
}

// sseWriter streams a response as server-sent events in vLLM's chunk
// format, ending with the usage chunk (stream_options.include_usage) and
// data: [DONE].
type sseWriter struct {
	s     *Server
	w     http.ResponseWriter
	rc    *http.ResponseController
	j     *job
	detok detokenizer
	buf   bytes.Buffer
	// toolSent: a forced tool call went out whole, in place of the text.
	toolSent bool
}

func newSSEWriter(s *Server, w http.ResponseWriter, j *job) *sseWriter {
	return &sseWriter{s: s, w: w, rc: http.NewResponseController(w), j: j, detok: detokenizer{tok: s.tok}}
}

// start sends the headers and, for chat, the role chunk vLLM sends first;
// it is called once, before anything else.
func (o *sseWriter) start() error {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
	if o.j.kind == apiChat {
		empty := ""
		return o.chunk(choice{Delta: &message{Role: "assistant", Content: &empty}}, nil)
	}
	return o.rc.Flush()
}

func (o *sseWriter) tokens(ids []int) error {
	if t := o.j.tool; t != nil {
		if o.toolSent {
			return nil
		}
		o.toolSent = true
		idx, call := 0, t.call
		call.Index = &idx
		return o.chunk(choice{Delta: &message{ToolCalls: []toolCall{call}}}, nil)
	}
	if text := o.detok.push(ids); text != "" {
		return o.chunk(o.textChoice(text, nil), nil)
	}
	return nil
}

func (o *sseWriter) finish(fin *engine.Finished, reason string, kv *vllm.KVTransferParams) error {
	text := o.detok.flush()
	if t := o.j.tool; t != nil {
		text, reason = "", t.finishReason(reason)
	}
	if err := o.chunk(o.textChoice(text, &reason), kv); err != nil {
		return err
	}
	if o.j.includeUsage {
		if err := o.event(response{ID: o.j.id, Object: o.object(), Created: o.j.created, Model: o.j.model,
			Choices: []choice{}, Usage: usageOf(fin.Usage)}); err != nil {
			return err
		}
	}
	return o.done()
}

// fail ends a stream with an error event, as vLLM's stream generators
// answer a GenerationError: data: {"error":{...}}, then data: [DONE].
func (o *sseWriter) fail(e *apiError) error {
	if err := o.event(vllm.ErrorResponse{Error: e.ErrorInfo}); err != nil {
		return err
	}
	return o.done()
}

func (o *sseWriter) done() error {
	if _, err := o.w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return err
	}
	return o.rc.Flush()
}

func (o *sseWriter) object() string {
	if o.j.kind == apiChat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (o *sseWriter) textChoice(text string, reason *string) choice {
	if o.j.kind == apiChat {
		d := &message{}
		if text != "" || reason == nil {
			d.Content = &text
		}
		return choice{Delta: d, FinishReason: reason}
	}
	return choice{Text: &text, FinishReason: reason}
}

func (o *sseWriter) chunk(c choice, kv *vllm.KVTransferParams) error {
	return o.event(response{ID: o.j.id, Object: o.object(), Created: o.j.created, Model: o.j.model,
		Choices: []choice{c}, KVTransferParams: kv})
}

// event writes one data: line and flushes it to the client; an error means
// the client is gone.
func (o *sseWriter) event(v any) error {
	o.buf.Reset()
	o.buf.WriteString("data: ")
	enc := json.NewEncoder(&o.buf)
	enc.SetEscapeHTML(false) // vLLM sends "<" as is
	if err := enc.Encode(v); err != nil {
		return err
	}
	o.buf.WriteByte('\n') // Encode ended the line; the blank line ends the event
	if _, err := o.w.Write(o.buf.Bytes()); err != nil {
		return err
	}
	return o.rc.Flush()
}
