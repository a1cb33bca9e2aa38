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
	"unicode/utf8"

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
// rendered chat conversation (OpenAI chat or Anthropic messages), or the
// responses/embeddings input.
func Text(tmpl Templater, req *openai.Request) (string, error) {
	switch req.API {
	case openai.ChatCompletions, openai.Messages:
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

// bytesPerTokenGuess is the first text length tried per token wanted by
// TokensUpTo: well above English's ~4 bytes a token, so one encoding
// nearly always suffices.
const bytesPerTokenGuess = 16

// tailMargin is how many tokens past the cut TokensUpTo encodes and drops:
// only the text's last pre-token can tokenize differently when the text is
// cut in it, and it is short in any natural prompt.
const tailMargin = 1024

// TokensUpTo returns the first max of req's prompt token ids, encoding no
// more of the text than that needs: a prompt of megabytes costs what its
// first max tokens cost. truncated reports whether the prompt has more.
// The ids equal the first max of Tokens' unless the cut falls inside one
// pre-token longer than tailMargin tokens (a single enormous "word").
func TokensUpTo(enc Encoder, tmpl Templater, req *openai.Request, max int) (ids []int, truncated bool, err error) {
	if len(req.PromptTokenIDs) > 0 {
		ids := req.PromptTokenIDs
		return ids[:min(len(ids), max)], len(ids) > max, nil
	}
	text, err := Text(tmpl, req)
	if err != nil {
		return nil, false, err
	}
	for cut := (max + tailMargin) * bytesPerTokenGuess; ; cut *= 2 {
		if cut >= len(text) {
			ids := enc.Encode(text)
			return ids[:min(len(ids), max)], len(ids) > max, nil
		}
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		if ids := enc.Encode(text[:cut]); len(ids) >= max+tailMargin {
			return ids[:max], true, nil
		}
	}
}
