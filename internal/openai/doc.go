// Package openai parses the OpenAI-compatible request bodies the picker and
// the wasm filter route on (completions, chat completions, responses,
// embeddings) and extracts token usage from responses, JSON or SSE.
//
// It uses only the standard library so that it builds for GOOS=wasip1.
package openai
