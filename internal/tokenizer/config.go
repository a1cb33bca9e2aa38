package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// UnsupportedError reports a tokenizer.json feature this package does not
// implement. Field is the JSON path of the offending value so that the
// operator can tell which model file is the problem.
type UnsupportedError struct {
	Field string
	Value string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("tokenizer: unsupported %s = %s", e.Field, e.Value)
}

// ErrMalformed wraps structural problems with tokenizer.json or
// tokenizer_config.json (bad JSON, missing vocabulary entries, ...).
var ErrMalformed = errors.New("tokenizer: malformed tokenizer files")

// The split patterns we have hand-written matchers for. They differ only in
// how many digits one pre-token may hold.
const (
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         modelJSON        `json:"model"`
}

type addedTokenJSON struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// component is the common shape of normalizers, pre-tokenizers, decoders and
// post-processors; only the fields this package understands are decoded.
type component struct {
	Type          string          `json:"type"`
	Normalizers   []component     `json:"normalizers"`
	PreTokenizers []component     `json:"pretokenizers"`
	Processors    []component     `json:"processors"`
	Decoders      []component     `json:"decoders"`
	Pattern       json.RawMessage `json:"pattern"`
	Behavior      string          `json:"behavior"`
	Invert        bool            `json:"invert"`
	AddPrefixSpc  bool            `json:"add_prefix_space"`
	UseRegex      *bool           `json:"use_regex"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

func parseComponent(field string, raw json.RawMessage) (*component, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, field, err)
	}
	return &c, nil
}

// checkNormalizer accepts no normalizer or NFC (possibly inside a Sequence).
func checkNormalizer(raw json.RawMessage) (nfc bool, err error) {
	c, err := parseComponent("normalizer", raw)
	if err != nil || c == nil {
		return false, err
	}
	items := []component{*c}
	if c.Type == "Sequence" {
		items = c.Normalizers
	}
	for i, n := range items {
		if n.Type != "NFC" {
			field := "normalizer.type"
			if c.Type == "Sequence" {
				field = fmt.Sprintf("normalizer.normalizers[%d].type", i)
			}
			return false, &UnsupportedError{Field: field, Value: n.Type}
		}
		nfc = true
	}
	return nfc, nil
}

// checkPreTokenizer accepts the Sequence[Split(pattern), ByteLevel] layout of
// Qwen2/3 and Llama 3 and returns the pre-token digit limit of the pattern.
func checkPreTokenizer(raw json.RawMessage) (maxDigits int, err error) {
	c, err := parseComponent("pre_tokenizer", raw)
	if err != nil {
		return 0, err
	}
	if c == nil {
		return 0, &UnsupportedError{Field: "pre_tokenizer", Value: "null"}
	}
	if c.Type != "Sequence" || len(c.PreTokenizers) != 2 {
		return 0, &UnsupportedError{Field: "pre_tokenizer.type", Value: c.Type + " (want Sequence[Split, ByteLevel])"}
	}
	split, bl := c.PreTokenizers[0], c.PreTokenizers[1]
	if split.Type != "Split" {
		return 0, &UnsupportedError{Field: "pre_tokenizer.pretokenizers[0].type", Value: split.Type}
	}
	var pat struct {
		Regex *string `json:"Regex"`
	}
	if err := json.Unmarshal(split.Pattern, &pat); err != nil || pat.Regex == nil {
		return 0, &UnsupportedError{Field: "pre_tokenizer.pretokenizers[0].pattern", Value: string(split.Pattern)}
	}
	switch *pat.Regex {
	case patternQwen2:
		maxDigits = 1
	case patternLlama3:
		maxDigits = 3
	default:
		return 0, &UnsupportedError{Field: "pre_tokenizer.pretokenizers[0].pattern.Regex", Value: *pat.Regex}
	}
	if split.Behavior != "Isolated" || split.Invert {
		return 0, &UnsupportedError{Field: "pre_tokenizer.pretokenizers[0].behavior", Value: fmt.Sprintf("%s invert=%v", split.Behavior, split.Invert)}
	}
	if bl.Type != "ByteLevel" {
		return 0, &UnsupportedError{Field: "pre_tokenizer.pretokenizers[1].type", Value: bl.Type}
	}
	if bl.AddPrefixSpc || (bl.UseRegex != nil && *bl.UseRegex) {
		return 0, &UnsupportedError{Field: "pre_tokenizer.pretokenizers[1]", Value: "ByteLevel with add_prefix_space or use_regex"}
	}
	return maxDigits, nil
}

// checkByteLevelOnly accepts a null component or a ByteLevel one (optionally
// inside a Sequence); post-processors that add BOS/EOS are not supported.
func checkByteLevelOnly(field string, raw json.RawMessage) error {
	c, err := parseComponent(field, raw)
	if err != nil || c == nil {
		return err
	}
	items := []component{*c}
	if c.Type == "Sequence" {
		items = append(append(c.Processors, c.Decoders...), c.PreTokenizers...)
	}
	for _, it := range items {
		if it.Type != "ByteLevel" {
			return &UnsupportedError{Field: field + ".type", Value: it.Type}
		}
		if it.AddPrefixSpc {
			return &UnsupportedError{Field: field + ".add_prefix_space", Value: "true"}
		}
	}
	return nil
}

func checkModel(m *modelJSON) error {
	switch {
	case m.Type != "BPE":
		return &UnsupportedError{Field: "model.type", Value: m.Type}
	case m.Dropout != nil && *m.Dropout != 0:
		return &UnsupportedError{Field: "model.dropout", Value: fmt.Sprint(*m.Dropout)}
	case m.ByteFallback:
		return &UnsupportedError{Field: "model.byte_fallback", Value: "true"}
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return &UnsupportedError{Field: "model.continuing_subword_prefix", Value: *m.ContinuingSubwordPrefix}
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return &UnsupportedError{Field: "model.end_of_word_suffix", Value: *m.EndOfWordSuffix}
	case len(m.Vocab) == 0:
		return fmt.Errorf("%w: model.vocab is empty", ErrMalformed)
	}
	return nil
}

func checkAddedToken(i int, a *addedTokenJSON) error {
	field := fmt.Sprintf("added_tokens[%d]", i)
	switch {
	case a.Content == "":
		return fmt.Errorf("%w: %s.content is empty", ErrMalformed, field)
	case a.SingleWord:
		return &UnsupportedError{Field: field + ".single_word", Value: "true"}
	case a.LStrip:
		return &UnsupportedError{Field: field + ".lstrip", Value: "true"}
	case a.RStrip:
		return &UnsupportedError{Field: field + ".rstrip", Value: "true"}
	case a.Normalized:
		// Normalized added tokens are matched on normalized text in a
		// second pass; no model we serve needs that.
		return &UnsupportedError{Field: field + ".normalized", Value: "true"}
	}
	return nil
}

// parseMerges accepts both spellings of merges: "a b" strings and ["a","b"]
// pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("%w: model.merges: %w", ErrMalformed, err)
	}
	pairs = make([][2]string, len(lines))
	for i, l := range lines {
		a, b, ok := strings.Cut(l, " ")
		if !ok {
			return nil, fmt.Errorf("%w: model.merges[%d] = %q has no space", ErrMalformed, i, l)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

// tokenizerConfig is the part of tokenizer_config.json this package uses.
type tokenizerConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	EOSToken     json.RawMessage `json:"eos_token"`
	BOSToken     json.RawMessage `json:"bos_token"`
}

// tokenName reads eos_token/bos_token, which are either a string or an
// AddedToken object with a content field.
func tokenName(raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// chatTemplates reads chat_template, which is either one template string or
// a list of {name, template}; the one named "default" is the default.
func chatTemplates(raw json.RawMessage) (map[string]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return map[string]string{"default": s}, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%w: chat_template: %w", ErrMalformed, err)
	}
	out := make(map[string]string, len(list))
	for _, t := range list {
		out[t.Name] = t.Template
	}
	return out, nil
}
