package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/internal/tokenizer/jinja"
)

// TestApplyChatTemplateQwen3 compares with Python Jinja2 renderings of the
// Qwen3 template (jinja/testdata/golden.json, made by gen_golden.py with
// transformers' settings).
func TestApplyChatTemplateQwen3(t *testing.T) {
	tok := qwen3(t)
	raw, err := os.ReadFile(filepath.Join("jinja", "testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []struct {
			Template string `json:"template"`
			Vars     struct {
				Messages            []struct{ Role, Content string } `json:"messages"`
				AddGenerationPrompt bool                             `json:"add_generation_prompt"`
				EnableThinking      *bool                            `json:"enable_thinking"`
			} `json:"vars"`
			Want string `json:"want"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range g.Cases {
		if c.Template != "qwen3" || c.Vars.EnableThinking != nil {
			continue
		}
		n++
		msgs := make([]Message, len(c.Vars.Messages))
		for i, m := range c.Vars.Messages {
			msgs[i] = Message{Role: m.Role, Content: m.Content}
		}
		got, err := tok.ApplyChatTemplate(msgs, c.Vars.AddGenerationPrompt)
		if err != nil {
			t.Fatalf("ApplyChatTemplate: %v", err)
		}
		if got != c.Want {
			t.Errorf("messages %+v:\n got %q\nwant %q", msgs, got, c.Want)
		}
	}
	if n < 10 {
		t.Fatalf("only %d Qwen3 golden cases", n)
	}
	prompt, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "Hello!"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(prompt)
	want := []int{151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198}
	if len(ids) != len(want) {
		t.Fatalf("Encode(%q) = %v, want %v", prompt, ids, want)
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("Encode(%q) = %v, want %v", prompt, ids, want)
		}
	}
}

func TestApplyChatTemplateErrors(t *testing.T) {
	vocab, err := json.Marshal(map[string]any{
		"pre_tokenizer": json.RawMessage(`{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":` + mustJSON(patternQwen2) + `},"behavior":"Isolated"},{"type":"ByteLevel"}]}`),
		"model":         map[string]any{"type": "BPE", "vocab": byteVocab(), "merges": []any{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		config string
		check  func(error) bool
	}{
		{`{}`, func(err error) bool { return errors.Is(err, ErrNoChatTemplate) }},
		{`{"chat_template": "{% if %}"}`, func(err error) bool { var se *jinja.SyntaxError; return errors.As(err, &se) }},
		{`{"chat_template": "{{ raise_exception('no system') }}"}`, func(err error) bool {
			var re *jinja.RaisedError
			return errors.As(err, &re) && re.Message == "no system"
		}},
		{`{"chat_template": [{"name": "default", "template": "{{ messages[0].content }}"}]}`, func(err error) bool { return err == nil }},
	}
	for _, c := range cases {
		tok, err := LoadFromBytes(vocab, []byte(c.config))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "x"}}, true); !c.check(err) {
			t.Errorf("config %s: unexpected error %v", c.config, err)
		}
	}
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
