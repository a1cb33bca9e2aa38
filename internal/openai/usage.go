package openai

import (
	"bytes"
	"encoding/json"
)

// Usage is the token accounting a model server reports for one response.
// The Responses API's input_tokens/output_tokens map to the prompt and
// completion counts.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is prompt_tokens_details.cached_tokens: prompt tokens
	// served from the server's prefix cache.
	CachedTokens int
}

// maxUsageBytes bounds the bytes kept for one usage object. Real ones are a
// few hundred bytes; anything larger is not a usage object worth trusting.
const maxUsageBytes = 4096

// UsageScanner extracts usage from a response body as it streams past,
// without buffering the body: a JSON body (chat/completions, completions,
// embeddings, responses) or an SSE stream whose data events carry JSON
// chunks (usage in the last chunk when stream_options.include_usage is set,
// or in the response.completed event of the Responses API).
//
// Memory is bounded: only the usage value itself (at most 4 KiB) and a few
// bytes of SSE line state are kept, however the body is chunked. Malformed
// input yields no usage; it never fails.
//
// The zero value scans a JSON body. A UsageScanner is not safe for
// concurrent use.
type UsageScanner struct {
	sse   bool
	usage Usage
	found bool
	done  bool

	doc usageExtractor // the JSON document being scanned (the current SSE event)

	// SSE line state. A field name longer than field's capacity cannot be
	// "data", so only its length matters.
	inValue   bool // past the field name's colon
	isData    bool // the current line is a data line
	skipSpace bool // drop one space right after "data:"
	afterCR   bool // a CR ended the last line; a following LF belongs to it
	field     [4]byte
	fieldLen  int
	dataLines int     // data lines in the current event
	dataLen   int     // data bytes in the current event
	prefix    [6]byte // first bytes of the event's data, to spot [DONE]
}

// NewUsageScanner returns a scanner for an SSE body when streaming is true,
// and for a JSON body otherwise.
func NewUsageScanner(streaming bool) *UsageScanner {
	s := &UsageScanner{}
	s.Reset(streaming)
	return s
}

// Reset prepares s for a new body, keeping its buffers.
func (s *UsageScanner) Reset(streaming bool) {
	buf := s.doc.capture[:0]
	*s = UsageScanner{sse: streaming}
	s.doc.capture = buf
}

// Write scans the next chunk of the body. It always consumes all of p, so
// that a UsageScanner can sit behind an io.MultiWriter.
func (s *UsageScanner) Write(p []byte) (int, error) {
	if !s.sse {
		s.doc.write(p)
		return len(p), nil
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if s.afterCR {
			s.afterCR = false
			if c == '\n' {
				continue
			}
		}
		if c == '\r' || c == '\n' {
			s.endLine()
			s.afterCR = c == '\r'
			continue
		}
		if !s.inValue {
			if c == ':' {
				s.inValue = true
				s.isData = s.fieldLen == 4 && string(s.field[:]) == "data"
				s.skipSpace = s.isData
				if s.isData {
					s.startDataLine()
				}
				continue
			}
			if s.fieldLen < len(s.field) {
				s.field[s.fieldLen] = c
			}
			s.fieldLen++
			continue
		}
		if !s.isData {
			continue
		}
		if s.skipSpace {
			s.skipSpace = false
			if c == ' ' {
				continue
			}
		}
		// Feed the rest of the line in one go: data values are where the
		// bytes are.
		j := i
		for j < len(p) && p[j] != '\n' && p[j] != '\r' {
			j++
		}
		s.data(p[i:j])
		i = j - 1
	}
	return len(p), nil
}

// Close ends the body: an SSE event left without its blank line still counts.
func (s *UsageScanner) Close() error {
	if s.sse {
		s.endLine()
		s.dispatch()
		return nil
	}
	s.collect()
	return nil
}

// Usage returns the last usage seen; ok is false when none was found.
func (s *UsageScanner) Usage() (u Usage, ok bool) {
	if !s.sse {
		s.collect()
	}
	return s.usage, s.found
}

// Done reports whether an SSE stream sent its terminating "data: [DONE]".
func (s *UsageScanner) Done() bool { return s.done }

func (s *UsageScanner) collect() {
	if u, ok := s.doc.result(); ok {
		s.usage, s.found = u, true
	}
}

func (s *UsageScanner) endLine() {
	if !s.inValue && s.fieldLen == 0 {
		s.dispatch() // a blank line ends the event
		return
	}
	if !s.inValue && s.fieldLen == 4 && string(s.field[:]) == "data" {
		s.startDataLine() // "data" with no colon is a data line with an empty value
	}
	s.inValue, s.isData, s.skipSpace, s.fieldLen = false, false, false, 0
}

func (s *UsageScanner) startDataLine() {
	if s.dataLines > 0 {
		s.data([]byte{'\n'}) // data lines of one event join with LF
	}
	s.dataLines++
}

func (s *UsageScanner) data(b []byte) {
	if s.dataLen < len(s.prefix) {
		copy(s.prefix[s.dataLen:], b)
	}
	s.dataLen += len(b)
	s.doc.write(b)
}

func (s *UsageScanner) dispatch() {
	if s.dataLines > 0 {
		if s.dataLen == len(s.prefix) && string(s.prefix[:]) == "[DONE]" {
			s.done = true
		} else {
			s.collect()
		}
	}
	buf := s.doc.capture[:0]
	s.doc = usageExtractor{capture: buf}
	s.dataLines, s.dataLen = 0, 0
}

// keyClass is what the scanner needs to know about an object key.
type keyClass uint8

const (
	keyOther keyClass = iota
	keyUsage
	keyResponse
)

// usageExtractor walks one JSON document byte by byte and keeps the value of
// the top-level "usage" key, or of "response"."usage" (Responses API stream
// events). It tracks only what that needs: nesting depth, string state, and
// object keys at depths 1 and 2.
type usageExtractor struct {
	depth    int
	broken   bool
	inString bool
	escaped  bool

	expectKey  bool // the next string at this depth is an object key
	readingKey bool
	key        [8]byte
	keyLen     int
	isObject   [3]bool // container kind at depths 1 and 2
	keys       [3]keyClass

	pending    bool // a target key's colon was seen; the value starts next
	capturing  bool
	captureAt  int // depth of the key whose value is being captured
	capture    []byte
	haveResult bool
	got        Usage
}

func (x *usageExtractor) write(p []byte) {
	for i := 0; i < len(p); i++ {
		if x.broken {
			return
		}
		if x.inString {
			if !x.escaped && !x.capturing && !x.readingKey {
				// String contents (the generated text) are most of the
				// bytes and matter only where they end.
				j := bytes.IndexAny(p[i:], `"\`)
				if j < 0 {
					return
				}
				i += j
			}
			x.stringByte(p[i])
			continue
		}
		c := p[i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			if x.capturing {
				x.keep(c)
			}
			continue
		}
		if x.pending {
			x.pending, x.capturing, x.captureAt = false, true, x.depth
			if x.capture == nil {
				x.capture = make([]byte, 0, 256) // room for a typical usage object
			}
			x.capture = x.capture[:0]
		}
		if x.capturing && x.depth == x.captureAt && (c == ',' || c == '}' || c == ']') {
			x.finishCapture()
		} else if x.capturing {
			x.keep(c)
		}
		x.structural(c)
	}
}

func (x *usageExtractor) stringByte(c byte) {
	if x.capturing {
		x.keep(c)
	}
	switch {
	case x.escaped:
		x.escaped = false
		x.keyByte(c)
	case c == '\\':
		x.escaped = true
		x.keyByte(c)
	case c == '"':
		x.inString = false
		if x.readingKey {
			x.readingKey = false
			x.endKey()
		}
	default:
		x.keyByte(c)
	}
}

func (x *usageExtractor) keyByte(c byte) {
	if !x.readingKey {
		return
	}
	if x.keyLen < len(x.key) {
		x.key[x.keyLen] = c
	}
	x.keyLen++
}

func (x *usageExtractor) endKey() {
	if x.depth < 1 || x.depth > 2 {
		return
	}
	k := keyOther
	switch string(x.key[:min(x.keyLen, len(x.key))]) {
	case "usage":
		k = keyUsage
	case "response":
		k = keyResponse
	}
	if x.keyLen > len(x.key) {
		k = keyOther
	}
	x.keys[x.depth] = k
}

func (x *usageExtractor) structural(c byte) {
	switch c {
	case '"':
		x.inString = true
		x.readingKey = x.expectKey
		x.keyLen = 0
		x.expectKey = false
	case '{', '[':
		x.depth++
		if x.depth <= 2 {
			x.isObject[x.depth] = c == '{'
			x.keys[x.depth] = keyOther
		}
		x.expectKey = c == '{'
	case '}', ']':
		if x.depth == 0 {
			x.broken = true
			return
		}
		x.depth--
		x.expectKey = false
	case ',':
		x.expectKey = x.depth >= 1 && x.depth <= 2 && x.isObject[x.depth]
	case ':':
		x.pending = x.targetKey()
	}
}

// targetKey reports whether the key just read names a usage value.
func (x *usageExtractor) targetKey() bool {
	switch x.depth {
	case 1:
		return x.isObject[1] && x.keys[1] == keyUsage
	case 2:
		return x.isObject[1] && x.keys[1] == keyResponse && x.isObject[2] && x.keys[2] == keyUsage
	}
	return false
}

func (x *usageExtractor) keep(c byte) {
	if len(x.capture) >= maxUsageBytes {
		x.capturing = false // too big to be a usage object: ignore it
		return
	}
	x.capture = append(x.capture, c)
}

func (x *usageExtractor) finishCapture() {
	x.capturing = false
	if string(x.capture) == "null" {
		return // include_usage streams carry "usage":null on every chunk
	}
	var u struct {
		PromptTokens        *int `json:"prompt_tokens"`
		CompletionTokens    int  `json:"completion_tokens"`
		InputTokens         *int `json:"input_tokens"`
		OutputTokens        int  `json:"output_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		InputTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	}
	if json.Unmarshal(x.capture, &u) != nil {
		return
	}
	var r Usage
	switch {
	case u.PromptTokens != nil:
		r.PromptTokens, r.CompletionTokens = *u.PromptTokens, u.CompletionTokens
	case u.InputTokens != nil:
		r.PromptTokens, r.CompletionTokens = *u.InputTokens, u.OutputTokens
	default:
		return // null, or an object that is not token usage
	}
	if d := u.PromptTokensDetails; d != nil {
		r.CachedTokens = d.CachedTokens
	} else if d := u.InputTokensDetails; d != nil {
		r.CachedTokens = d.CachedTokens
	}
	x.got, x.haveResult = r, true
}

func (x *usageExtractor) result() (Usage, bool) { return x.got, x.haveResult }
