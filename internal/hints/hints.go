package hints

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Header names. They are lower case because HTTP/2 and Envoy's header maps
// are.
const (
	HeaderPrefix    = "x-kvgate-"
	HeaderModel     = "x-kvgate-model"
	HeaderStream    = "x-kvgate-stream"
	HeaderPromptLen = "x-kvgate-prompt-len"
	HeaderMaxTokens = "x-kvgate-max-tokens"
	HeaderPrefixKey = "x-kvgate-prefix"
)

// IsHintHeader reports whether name is in the x-kvgate- namespace, which
// only the filter may write.
func IsHintHeader(name string) bool {
	return len(name) >= len(HeaderPrefix) && strings.EqualFold(name[:len(HeaderPrefix)], HeaderPrefix)
}

// ErrNoHints means the request carries no hints at all (the filter did not
// tag it); the picker then falls back to parsing the body.
var ErrNoHints = errors.New("hints: request not tagged")

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("hints: malformed")

// Hints is what the filter learned from the request body.
type Hints struct {
	Model  string
	Stream bool
	// PromptLen is in tokens: exact when Prefix.Mode is Precise and the
	// prompt fits the hashed blocks (a longer one is tokenized only that
	// far), else an estimate.
	PromptLen int
	// MaxTokens is 0 when the request sets no output limit.
	MaxTokens int
	// Prefix is nil when no prefix was hashed.
	Prefix *Prefix
}

// EstimateTokens is the token estimate for text when no tokenizer ran: the
// same 4 bytes per token the approximate prefix hashing assumes.
func EstimateTokens(textBytes int) int {
	return (textBytes + 3) / 4
}

// Encode writes h through set, one call per header.
func (h Hints) Encode(set func(name, value string)) {
	set(HeaderModel, escapeModel(h.Model))
	set(HeaderStream, strconv.FormatBool(h.Stream))
	set(HeaderPromptLen, strconv.Itoa(h.PromptLen))
	if h.MaxTokens > 0 {
		set(HeaderMaxTokens, strconv.Itoa(h.MaxTokens))
	}
	if h.Prefix != nil {
		set(HeaderPrefixKey, h.Prefix.Encode())
	}
}

// Decode reads hints through get, which returns a header's value and
// whether it is present. It returns ErrNoHints when x-kvgate-model is
// absent, and an error wrapping ErrMalformed when any value is invalid.
func Decode(get func(name string) (string, bool)) (Hints, error) {
	var h Hints
	model, ok := get(HeaderModel)
	if !ok {
		return h, ErrNoHints
	}
	var err error
	if h.Model, err = unescapeModel(model); err != nil {
		return Hints{}, err
	}
	s, ok := get(HeaderStream)
	switch {
	case !ok:
		return Hints{}, fmt.Errorf("%w: %s missing", ErrMalformed, HeaderStream)
	case s == "true":
		h.Stream = true
	case s != "false":
		return Hints{}, fmt.Errorf("%w: %s=%q", ErrMalformed, HeaderStream, s)
	}
	s, ok = get(HeaderPromptLen)
	if !ok {
		return Hints{}, fmt.Errorf("%w: %s missing", ErrMalformed, HeaderPromptLen)
	}
	if h.PromptLen, err = parseCount(HeaderPromptLen, s); err != nil {
		return Hints{}, err
	}
	if s, ok = get(HeaderMaxTokens); ok {
		if h.MaxTokens, err = parseCount(HeaderMaxTokens, s); err != nil {
			return Hints{}, err
		}
	}
	if s, ok = get(HeaderPrefixKey); ok {
		p, err := DecodePrefix(s)
		if err != nil {
			return Hints{}, err
		}
		h.Prefix = &p
	}
	return h, nil
}

// maxCount bounds the integers in headers so that sums of them cannot
// overflow on 32-bit platforms such as wasm.
const maxCount = 1<<31 - 1

// parseCount accepts canonical non-negative decimals only ("0", "12", not
// "012" or "+1"), so that one value has one spelling.
func parseCount(name, s string) (int, error) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: %s=%q", ErrMalformed, name, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %s=%q", ErrMalformed, name, s)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxCount {
		return 0, fmt.Errorf("%w: %s=%q out of range", ErrMalformed, name, s)
	}
	return int(n), nil
}

// escapeModel percent-encodes every byte outside visible ASCII and '%'
// itself: model names are user input and header values must not carry
// control characters.
func escapeModel(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c > ' ' && c < 0x7f && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func unescapeModel(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: %s empty", ErrMalformed, HeaderModel)
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) {
				return "", fmt.Errorf("%w: %s: truncated escape", ErrMalformed, HeaderModel)
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("%w: %s: bad escape", ErrMalformed, HeaderModel)
			}
			b.WriteByte(hi<<4 | lo)
			i += 2
		case c > ' ' && c < 0x7f:
			b.WriteByte(c)
		default:
			return "", fmt.Errorf("%w: %s: byte %#x must be escaped", ErrMalformed, HeaderModel, c)
		}
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
