package testutil

import "strings"

// AgentChat is a streamed chat request of about size bytes: a system
// prompt and user turns, as agents send. The filter's native benchmark
// (wasm-filter) and its wazero one (gateway/wasmhost) compare on this one
// body.
func AgentChat(size int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"Qwen/Qwen3-0.6B","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	turn := `,{"role":"user","content":"` + strings.Repeat("Explain how chained block hashes identify a prompt prefix. ", 16) + `"}`
	for sb.Len()+len(turn)+2 < size {
		sb.WriteString(turn)
	}
	sb.WriteString("]}")
	return []byte(sb.String())
}
