package openai

import (
	"encoding/json"
	"fmt"
)

// APIs of other request formats the picker routes on (the request
// parsers of llm-d's requestHandler): they are parsed into the same
// routing view as OpenAI bodies, so that the prefix hashes, the token
// renderings and the load estimates of a conversation do not depend on the
// API it came through.
const (
	// Messages is Anthropic's Messages API (/v1/messages). The system
	// prompt becomes a leading "system" message, so that a conversation
	// hashes and renders as the same chat completion would.
	Messages API = "messages"
	// Generate is vLLM's native /inference/v1/generate: a pre-tokenized
	// prompt (token_ids) and sampling_params.
	Generate API = "inference/v1/generate"
	// VLLMGRPC is vLLM's gRPC service (vllm.grpc.engine.VllmEngine's
	// Generate and Embed) as vllmgrpc-parser renders its protobuf: JSON
	// with the prompt as "text" or "token_ids", "stream" and generate's
	// "sampling_params"; no model (the server serves one).
	VLLMGRPC API = "vllm.grpc.engine.VllmEngine"
)

// decodeMessages decodes an Anthropic Messages body: model and at least
// one message are required; system is a string or an array of text blocks.
func (r *Request) decodeMessages() error {
	if err := r.field("messages", &r.Messages); err != nil {
		return err
	}
	if len(r.Messages) == 0 {
		return fmt.Errorf("%w: messages must contain at least one message", ErrInvalidRequest)
	}
	if sys, ok := r.fields["system"]; ok && string(sys) != "null" {
		var s string
		var blocks []json.RawMessage
		if json.Unmarshal(sys, &s) != nil && json.Unmarshal(sys, &blocks) != nil {
			return fmt.Errorf("%w: field \"system\": want a string or an array of content blocks", ErrInvalidRequest)
		}
		r.Messages = append([]Message{{Role: "system", Content: sys}}, r.Messages...)
	}
	return nil
}

// decodeGenerate decodes a vLLM generate body: non-empty token_ids; model
// is optional (the server serves one), sampling_params.max_tokens bounds
// the output.
func (r *Request) decodeGenerate() error {
	if err := r.field("token_ids", &r.PromptTokenIDs); err != nil {
		return err
	}
	if len(r.PromptTokenIDs) == 0 {
		return fmt.Errorf("%w: token_ids must not be empty", ErrInvalidRequest)
	}
	return r.decodeSampling()
}

// decodeGRPC decodes vllmgrpc-parser's rendering: text or token ids.
func (r *Request) decodeGRPC() error {
	if err := r.field("text", &r.Prompt); err != nil {
		return err
	}
	if err := r.field("token_ids", &r.PromptTokenIDs); err != nil {
		return err
	}
	if (r.Prompt == "") == (len(r.PromptTokenIDs) == 0) {
		return fmt.Errorf("%w: give the prompt as text or token ids", ErrInvalidRequest)
	}
	return r.decodeSampling()
}

// decodeSampling reads sampling_params.max_tokens.
func (r *Request) decodeSampling() error {
	var sp struct {
		MaxTokens *int `json:"max_tokens"`
	}
	if err := r.field("sampling_params", &sp); err != nil {
		return err
	}
	if sp.MaxTokens != nil {
		if *sp.MaxTokens < 0 {
			return fmt.Errorf("%w: sampling_params.max_tokens must be non-negative", ErrInvalidRequest)
		}
		r.MaxTokens = *sp.MaxTokens
	}
	return nil
}

// Wrap makes WithModel return wrap(body) rather than the rewritten body:
// for a request whose JSON travels inside an envelope (Vertex AI's gRPC
// messages), wrap rebuilds the envelope around the rewritten JSON.
func (r *Request) Wrap(wrap func(inner []byte) ([]byte, error)) { r.wrap = wrap }
