// Package prompt turns an OpenAI request into the token ids a vLLM server
// computes for it: completions prompts are encoded as given (or taken as
// token ids), chat messages are rendered with the model's chat template
// (add_generation_prompt=true) first. The picker's precise prefix scorer,
// the wasm filter's precise mode and the simulator must agree on this byte
// for byte, so they all use this one function.
//
// It builds for GOOS=wasip1.
package prompt

import (
	"fmt"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// Encoder encodes text; *tokenizer.Tokenizer and *tokenizer.PrefixCache are
// Encoders.
type Encoder interface {
	Encode(text string) []int
}

// Templater renders chat messages; *tokenizer.Tokenizer is a Templater.
type Templater interface {
	ApplyChatTemplate(msgs []tokenizer.Message, addGenerationPrompt bool) (string, error)
}

// Text is the text a server tokenizes for req: the completions prompt, the
// rendered chat conversation, or the responses/embeddings input.
func Text(tmpl Templater, req *openai.Request) (string, error) {
	switch req.API {
	case openai.ChatCompletions:
		msgs := make([]tokenizer.Message, len(req.Messages))
		for i, m := range req.Messages {
			msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Text()}
		}
		s, err := tmpl.ApplyChatTemplate(msgs, true)
		if err != nil {
			return "", fmt.Errorf("rendering chat template: %w", err)
		}
		return s, nil
	case openai.Completions:
		return req.Prompt, nil
	default:
		return req.Input, nil
	}
}

// Tokens returns req's prompt token ids. Token-id prompts are returned as
// given.
func Tokens(enc Encoder, tmpl Templater, req *openai.Request) ([]int, error) {
	if len(req.PromptTokenIDs) > 0 {
		return req.PromptTokenIDs, nil
	}
	text, err := Text(tmpl, req)
	if err != nil {
		return nil, err
	}
	return enc.Encode(text), nil
}
