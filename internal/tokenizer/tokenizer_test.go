package tokenizer

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

func TestEncodeMatchesVLLMVector(t *testing.T) {
	tok := qwen3(t)
	vec := testutil.LoadHashVector(t)
	got := tok.Encode(vec.Prompt)
	if len(got) < len(vec.TokenIDs) {
		t.Fatalf("got %d ids, vector has %d", len(got), len(vec.TokenIDs))
	}
	for i, want := range vec.TokenIDs {
		if got[i] != want {
			t.Fatalf("id %d: got %d (%q), want %d (%q)", i, got[i], tok.TokenString(got[i]), want, tok.TokenString(want))
		}
	}
	if d := tok.Decode(got); d != vec.Prompt {
		t.Errorf("Decode(Encode(prompt)) differs from prompt")
	}
}

func TestEncodeKnownIDs(t *testing.T) {
	tok := qwen3(t)
	// Expected ids come from the npm package's JavaScript tokenizer.
	cases := []struct {
		text string
		want []int
	}{
		{"Hello, my dog is cute<|im_start|> x  \n\n 123456 \ufb01 e\u0301", []int{9707, 11, 847, 5562, 374, 18838, 151644, 856, 18611, 220, 16, 17, 18, 19, 20, 21, 32495, 70731, 3958}},
		{"", nil},
		{"<|im_end|>", []int{151645}},
	}
	for _, c := range cases {
		if got := tok.Encode(c.text); !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func TestVocabAndTokens(t *testing.T) {
	tok := qwen3(t)
	if got := tok.VocabSize(); got != 151669 {
		t.Errorf("VocabSize = %d, want 151669", got)
	}
	if got := tok.TokenString(151645); got != "<|im_end|>" {
		t.Errorf("TokenString(151645) = %q", got)
	}
	if id, ok := tok.TokenID("<|im_end|>"); !ok || id != 151645 {
		t.Errorf("TokenID(<|im_end|>) = %d, %v", id, ok)
	}
	if tok.EOSToken() != "<|im_end|>" {
		t.Errorf("EOSToken = %q", tok.EOSToken())
	}
	if tok.TokenString(-1) != "" || tok.TokenString(1<<30) != "" {
		t.Error("TokenString of a non-token is not empty")
	}
}

func TestDecodeInvalidUTF8(t *testing.T) {
	tok := qwen3(t)
	if got := tok.Decode(tok.Encode("é")); got != "é" {
		t.Fatalf("Decode = %q", got)
	}
	// A lone continuation byte decodes to the replacement character.
	b, _ := tok.TokenID(string(byteToRune[0xA9]))
	if got := tok.Decode([]int{b, -5, 1 << 30}); got != "\uFFFD" {
		t.Errorf("Decode(lone continuation) = %q", got)
	}
}

func TestLoadErrors(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"normalizer":    map[string]any{"type": "NFC"},
			"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternQwen2}, "behavior": "Isolated", "invert": false}, map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}},
			"decoder":       map[string]any{"type": "ByteLevel"},
			"model":         map[string]any{"type": "BPE", "vocab": byteVocab(), "merges": []any{}},
			"added_tokens":  []any{},
		}
	}
	cases := []struct {
		name  string
		edit  func(m map[string]any)
		field string // UnsupportedError.Field; "" for a malformed-file error
	}{
		{"ok", func(map[string]any) {}, "-"},
		{"normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFKC"} }, "normalizer.type"},
		{"model type", func(m map[string]any) { m["model"].(map[string]any)["type"] = "Unigram" }, "model.type"},
		{"byte fallback", func(m map[string]any) { m["model"].(map[string]any)["byte_fallback"] = true }, "model.byte_fallback"},
		{"regex", func(m map[string]any) {
			m["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] = map[string]any{"Regex": `\w+`}
		}, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{"post processor", func(m map[string]any) { m["post_processor"] = map[string]any{"type": "TemplateProcessing"} }, "post_processor.type"},
		{"lstrip", func(m map[string]any) {
			m["added_tokens"] = []any{map[string]any{"id": 300, "content": "<x>", "lstrip": true}}
		}, "added_tokens[0].lstrip"},
		{"bad merge", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []any{"q zz"} }, ""},
		{"missing byte", func(m map[string]any) { delete(m["model"].(map[string]any)["vocab"].(map[string]int), "a") }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := base()
			c.edit(m)
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			_, err = LoadFromBytes(raw, nil)
			var ue *UnsupportedError
			switch {
			case c.field == "-":
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
			case c.field == "":
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("got %v, want ErrMalformed", err)
				}
			case !errors.As(err, &ue) || ue.Field != c.field:
				t.Fatalf("got %v, want UnsupportedError for %s", err, c.field)
			case !strings.Contains(err.Error(), c.field):
				t.Fatalf("error %q does not name %s", err, c.field)
			}
		})
	}
}

// byteVocab is the minimal byte-level vocabulary: one token per byte.
func byteVocab() map[string]int {
	v := make(map[string]int, 256)
	for b := 0; b < 256; b++ {
		v[string(byteToRune[b])] = b
	}
	return v
}
