package sidecar

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
)

// maxJSONResponse bounds a non-streamed decode response the rewriter
// holds whole; a larger one passes through unchanged.
const maxJSONResponse = 64 << 20

// maxSSELine bounds one held server-sent-events line; a longer line is
// passed through as it arrives, unchanged.
const maxSSELine = 4 << 20

// rewriteUsage sets usage.prompt_tokens_details.cached_tokens in one
// response object (or SSE chunk) to cached, creating
// prompt_tokens_details when it is absent or null (vLLM sends null when
// nothing was cached). An object without usage, or with usage null (every
// chunk but the last of a stream), comes back unchanged, as does anything
// that is not a JSON object.
func rewriteUsage(doc []byte, cached int) ([]byte, bool) {
	start, _, found, _, err := findKey(doc, "usage")
	if err != nil || !found || doc[start] != '{' {
		return doc, false
	}
	out, err := setPath(doc, json.RawMessage(strconv.Itoa(cached)), "usage", "prompt_tokens_details", "cached_tokens")
	if err != nil {
		return doc, false
	}
	return out, true
}

// rewriteSSELine rewrites one SSE line (without its line ending): a
// "data:" line holding a JSON object with usage gets the prefiller's
// cached_tokens; "data: [DONE]", comments, other fields and blank lines
// pass as they are.
func rewriteSSELine(line []byte, cached int) []byte {
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return line
	}
	lead := len(payload) - len(bytes.TrimLeft(payload, " "))
	out, changed := rewriteUsage(payload[lead:], cached)
	if !changed {
		return line
	}
	return append(append([]byte("data:"), payload[:lead]...), out...)
}

// usageWriter is the decode leg's response writer: llm-d's sidecar shows
// the client the prefiller's cached_tokens (the prompt's cache hit happened
// there; the decoder's count is the pulled KV), in a JSON body or in the
// SSE stream's usage chunk. Error responses and other content types pass
// through unchanged. Content-Length is dropped from rewritten responses.
type usageWriter struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	cached int
	mode   uint8
	status int
	buf    bytes.Buffer // json: the whole body; sse: the partial last line
}

const (
	modeUndecided uint8 = iota
	modePass
	modeJSON
	modeSSE
)

func newUsageWriter(w http.ResponseWriter, cached int) *usageWriter {
	return &usageWriter{w: w, rc: http.NewResponseController(w), cached: cached}
}

func (u *usageWriter) Header() http.Header { return u.w.Header() }

func (u *usageWriter) WriteHeader(status int) {
	if u.mode != modeUndecided {
		return
	}
	u.status = status
	ct, _, _ := mime.ParseMediaType(u.w.Header().Get("Content-Type"))
	switch {
	case status < 200 || status > 299:
		u.mode = modePass
	case ct == "text/event-stream":
		u.mode = modeSSE
	case ct == "application/json":
		u.mode = modeJSON
		u.w.Header().Del("Content-Length")
		return // the header goes with the rewritten body
	default:
		u.mode = modePass
	}
	if u.mode == modeSSE {
		u.w.Header().Del("Content-Length")
	}
	u.w.WriteHeader(status)
}

func (u *usageWriter) Write(p []byte) (int, error) {
	if u.mode == modeUndecided {
		u.WriteHeader(http.StatusOK)
	}
	switch u.mode {
	case modeJSON:
		if u.buf.Len()+len(p) > maxJSONResponse {
			// Too large to hold: send what there is unchanged and pass on.
			u.mode = modePass
			u.w.WriteHeader(u.status)
			if _, err := u.w.Write(u.buf.Bytes()); err != nil {
				return 0, err
			}
			u.buf.Reset()
			return u.w.Write(p)
		}
		return u.buf.Write(p)
	case modeSSE:
		return len(p), u.writeSSE(p)
	default:
		return u.w.Write(p)
	}
}

// writeSSE sends every complete line of what has arrived, rewritten, and
// holds the incomplete last one.
func (u *usageWriter) writeSSE(p []byte) error {
	u.buf.Write(p)
	data := u.buf.Bytes()
	var out []byte
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line, eol := data[:i], data[i:i+1]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line, eol = line[:n-1], data[i-1:i+1]
		}
		out = append(append(out, rewriteSSELine(line, u.cached)...), eol...)
		data = data[i+1:]
	}
	if len(data) > maxSSELine {
		out = append(out, data...)
		data = nil
	}
	rest := append([]byte(nil), data...)
	u.buf.Reset()
	u.buf.Write(rest)
	if len(out) == 0 {
		return nil
	}
	_, err := u.w.Write(out)
	return err
}

// sent reports whether anything (the header) went to the client: a held
// JSON answer sends nothing until finish.
func (u *usageWriter) sent() bool { return u.mode == modeSSE || u.mode == modePass }

// Flush sends what is complete. ReverseProxy-style copiers call it after
// each read, so SSE chunks reach the client as they come.
func (u *usageWriter) Flush() {
	if u.mode == modeSSE || u.mode == modePass {
		_ = u.rc.Flush()
	}
}

// finish writes what is held: the rewritten JSON body, or a stream's
// unterminated last line.
func (u *usageWriter) finish() error {
	switch u.mode {
	case modeJSON:
		out, _ := rewriteUsage(u.buf.Bytes(), u.cached)
		u.w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		u.w.WriteHeader(u.status)
		_, err := u.w.Write(out)
		return err
	case modeSSE:
		if u.buf.Len() > 0 {
			if _, err := u.w.Write(rewriteSSELine(u.buf.Bytes(), u.cached)); err != nil {
				return err
			}
		}
		return u.rc.Flush()
	}
	return nil
}
