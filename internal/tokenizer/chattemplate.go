package tokenizer

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvgate/kvgate/internal/tokenizer/jinja"
)

// Message is one chat message as the template sees it.
type Message struct {
	Role    string
	Content string
}

// ErrNoChatTemplate is returned by ApplyChatTemplate when
// tokenizer_config.json has no chat_template.
var ErrNoChatTemplate = errors.New("tokenizer: no chat template")

// chatTemplate is parsed on first use, so that a template this package
// cannot parse only affects chat rendering, not Encode.
type chatTemplate struct {
	once sync.Once
	tpl  *jinja.Template
	err  error
}

func (t *Tokenizer) parsedTemplate() (*jinja.Template, error) {
	t.chat.once.Do(func() {
		src, ok := t.templates["default"]
		if !ok {
			t.chat.err = ErrNoChatTemplate
			return
		}
		if t.chat.tpl, t.chat.err = jinja.Parse(src); t.chat.err != nil {
			t.chat.err = fmt.Errorf("tokenizer: chat template: %w", t.chat.err)
		}
	})
	return t.chat.tpl, t.chat.err
}

// ApplyChatTemplate renders msgs with the model's chat template the way vLLM
// does for /v1/chat/completions without tools: messages, tools=None,
// documents=None, add_generation_prompt, and the special-token names from
// tokenizer_config.json. A *jinja.RaisedError means the template rejected
// the conversation (vLLM answers 400).
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	tpl, err := t.parsedTemplate()
	if err != nil {
		return "", err
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		d.Set("role", m.Role)
		d.Set("content", m.Content)
		list[i] = d
	}
	vars := map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"tools":                 nil,
		"documents":             nil,
	}
	// transformers passes the special tokens; unset ones are None.
	vars["bos_token"], vars["eos_token"] = optional(t.bos), optional(t.eos)
	out, err := tpl.Render(vars)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template: %w", err)
	}
	return out, nil
}

func optional(s string) any {
	if s == "" {
		return nil
	}
	return s
}
