package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and back. It is immutable after Load
// and safe for concurrent use.
type Tokenizer struct {
	bpe       bpeModel
	maxDigits int
	nfc       bool

	idToToken []string // vocabulary spelling, or added-token content
	isAdded   []bool
	added     addedMatcher
	// addedBoundaries is true when no added token occurs inside another, so
	// the end of an added-token match is a split point whatever text follows
	// (see PrefixCache).
	addedBoundaries bool

	eos, bos  string
	templates map[string]string
	chat      *chatTemplate

	words *wordCache
}

// DefaultWordCacheSize bounds the per-tokenizer word cache (entries).
const DefaultWordCacheSize = 1 << 16

// Load reads tokenizer.json and tokenizer_config.json from dir. The config
// file is optional; without it there is no chat template.
func Load(dir string) (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	cj, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return LoadFromBytes(tj, cj)
}

// LoadFromBytes builds a Tokenizer from the contents of tokenizer.json and
// tokenizer_config.json (configJSON may be nil).
func LoadFromBytes(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %w", ErrMalformed, err)
	}
	t := &Tokenizer{words: newWordCache(DefaultWordCacheSize), chat: &chatTemplate{}}
	var err error
	if err = checkModel(&f.Model); err != nil {
		return nil, err
	}
	if t.nfc, err = checkNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.maxDigits, err = checkPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err = checkByteLevelOnly("post_processor", f.PostProcessor); err != nil {
		return nil, err
	}
	if err = checkByteLevelOnly("decoder", f.Decoder); err != nil {
		return nil, err
	}
	if err = t.buildModel(&f.Model); err != nil {
		return nil, err
	}
	if err = t.buildAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	if len(configJSON) > 0 {
		var c tokenizerConfig
		if err := json.Unmarshal(configJSON, &c); err != nil {
			return nil, fmt.Errorf("%w: tokenizer_config.json: %w", ErrMalformed, err)
		}
		t.eos, t.bos = tokenName(c.EOSToken), tokenName(c.BOSToken)
		if t.templates, err = chatTemplates(c.ChatTemplate); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *Tokenizer) buildModel(m *modelJSON) error {
	size := 0
	for _, id := range m.Vocab {
		if id < 0 {
			return fmt.Errorf("%w: model.vocab has negative id %d", ErrMalformed, id)
		}
		size = max(size, id+1)
	}
	t.idToToken = make([]string, size)
	t.isAdded = make([]bool, size)
	t.bpe.vocab = make(map[string]int32, len(m.Vocab))
	for tok, id := range m.Vocab {
		t.idToToken[id] = tok
		t.bpe.vocab[tok] = int32(id)
	}
	for b := 0; b < 256; b++ {
		id, ok := t.bpe.vocab[string(byteToRune[b])]
		if !ok {
			return fmt.Errorf("%w: model.vocab lacks the byte-level token for byte 0x%02x", ErrMalformed, b)
		}
		t.bpe.byteID[b] = id
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return err
	}
	t.bpe.merges = make(map[uint64]merge, len(pairs))
	t.bpe.ignoreMerges = m.IgnoreMerges
	for rank, p := range pairs {
		a, okA := t.bpe.vocab[p[0]]
		b, okB := t.bpe.vocab[p[1]]
		c, okC := t.bpe.vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return fmt.Errorf("%w: model.merges[%d] = %q %q refers to tokens missing from the vocabulary", ErrMalformed, rank, p[0], p[1])
		}
		k := mergeKey(a, b)
		if _, dup := t.bpe.merges[k]; !dup { // the first (best) rank wins
			t.bpe.merges[k] = merge{rank: int32(rank), id: c}
		}
	}
	return nil
}

func (t *Tokenizer) buildAdded(list []addedTokenJSON) error {
	byContent := make(map[string]int, len(list))
	for i := range list {
		a := &list[i]
		if err := checkAddedToken(i, a); err != nil {
			return err
		}
		if a.ID < 0 {
			return fmt.Errorf("%w: added_tokens[%d].id is negative", ErrMalformed, i)
		}
		for a.ID >= len(t.idToToken) {
			t.idToToken = append(t.idToToken, "")
			t.isAdded = append(t.isAdded, false)
		}
		t.idToToken[a.ID] = a.Content
		t.isAdded[a.ID] = true
		byContent[a.Content] = a.ID
	}
	t.added = newAddedMatcher(byContent)
	t.addedBoundaries = true
	for a := range byContent {
		for b := range byContent {
			if a != b && strings.Contains(b, a) {
				t.addedBoundaries = false
			}
		}
	}
	return nil
}

// VocabSize is one more than the largest token id, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// TokenString returns the vocabulary spelling of id (byte-level form for
// ordinary tokens, the literal content for added tokens), or "" when id is
// not a token.
func (t *Tokenizer) TokenString(id int) string {
	if id < 0 || id >= len(t.idToToken) {
		return ""
	}
	return t.idToToken[id]
}

// TokenID returns the id of a vocabulary spelling or added-token content.
func (t *Tokenizer) TokenID(tok string) (int, bool) {
	if id, ok := t.added.ids[tok]; ok {
		return id, true
	}
	id, ok := t.bpe.vocab[tok]
	return int(id), ok
}

// EOSToken and BOSToken are the tokenizer_config.json names ("" when unset).
func (t *Tokenizer) EOSToken() string { return t.eos }

// BOSToken: see EOSToken.
func (t *Tokenizer) BOSToken() string { return t.bos }

// Encode returns the token ids of text as vLLM computes them for a prompt:
// added and special tokens written in the text are recognised, and no BOS or
// EOS is added (the byte-level post-processor adds none).
func (t *Tokenizer) Encode(text string) []int {
	return t.AppendEncode(make([]int, 0, len(text)/4+1), text)
}

// AppendEncode appends the ids of text to dst.
func (t *Tokenizer) AppendEncode(dst []int, text string) []int {
	for len(text) > 0 {
		at, n, id := t.added.find(text)
		dst = t.appendPlain(dst, text[:at])
		if n == 0 {
			break
		}
		dst = append(dst, id)
		text = text[at+n:]
	}
	return dst
}

// appendPlain encodes text that contains no added tokens.
func (t *Tokenizer) appendPlain(dst []int, text string) []int {
	if text == "" {
		return dst
	}
	if t.nfc && !isASCII(text) && !norm.NFC.IsNormalString(text) {
		text = norm.NFC.String(text)
	}
	for len(text) > 0 {
		n := nextPreToken(text, t.maxDigits)
		dst = t.appendWord(dst, text[:n])
		text = text[n:]
	}
	return dst
}

func (t *Tokenizer) appendWord(dst []int, word string) []int {
	if len(word) > maxCachedWord {
		return t.bpe.appendWord(dst, word)
	}
	if out, ok := t.words.appendCached(dst, word); ok {
		return out
	}
	start := len(dst)
	dst = t.bpe.appendWord(dst, word)
	t.words.put(word, dst[start:])
	return dst
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// Decode turns ids back into text. Added tokens appear literally; ids that are
// not tokens are skipped; byte sequences that are not valid UTF-8 (a
// multi-byte character cut between ids) become U+FFFD.
func (t *Tokenizer) Decode(ids []int) string {
	var buf []byte
	for _, id := range ids {
		if id < 0 || id >= len(t.idToToken) {
			continue
		}
		tok := t.idToToken[id]
		if t.isAdded[id] {
			buf = append(buf, tok...)
			continue
		}
		var ok bool
		if buf, ok = appendByteLevelDecoded(buf, tok); !ok {
			buf = append(buf, tok...)
		}
	}
	return strings.ToValidUTF8(string(buf), "\uFFFD")
}

// addedMatcher finds added tokens in raw text, leftmost first and longest at
// a position, as the Rust tokenizers crate does.
type addedMatcher struct {
	ids     map[string]int
	byFirst [256][]string // candidates per first byte, longest first
}

func newAddedMatcher(ids map[string]int) addedMatcher {
	m := addedMatcher{ids: ids}
	for s := range ids {
		m.byFirst[s[0]] = append(m.byFirst[s[0]], s)
	}
	for i := range m.byFirst {
		c := m.byFirst[i]
		sort.Slice(c, func(a, b int) bool {
			if len(c[a]) != len(c[b]) {
				return len(c[a]) > len(c[b])
			}
			return c[a] < c[b]
		})
	}
	return m
}

// find returns the offset and length of the first added token in s and its
// id; n is 0 when there is none.
func (m *addedMatcher) find(s string) (at, n, id int) {
	if len(m.ids) == 0 {
		return len(s), 0, 0
	}
	for i := 0; i < len(s); i++ {
		cands := m.byFirst[s[i]]
		if cands == nil {
			continue
		}
		for _, c := range cands {
			if strings.HasPrefix(s[i:], c) {
				return i, len(c), m.ids[c]
			}
		}
	}
	return len(s), 0, 0
}
