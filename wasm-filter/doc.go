// Command kvgate-filter is kvgate's proxy-wasm HTTP filter. Built with
//
//	GOEXPERIMENT=jsonv2 GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o bin/kvgate-filter.wasm ./wasm-filter
//
// (jsonv2 is optional but makes body parsing about 5x faster under wasm:
// encoding/json's classic scanner makes an indirect call per byte, which
// Go's wasm code pays dearly for.)
//
// it runs in Envoy (V8) or in kvgate's gateway (wazero) in front of the
// ext_proc picker. For OpenAI requests it buffers the body (up to
// maxBodyBytes), parses it once with internal/openai, hashes the prompt's
// prefix blocks and writes the result as x-kvgate-* headers (internal/hints),
// so that the picker can run headers-only. The body goes upstream unchanged.
//
// Every request first loses any x-kvgate-* header the client sent: the
// picker trusts those headers, so only this filter may write them.
// Requests that are not OpenAI, too large or malformed pass untagged and
// the picker falls back to the body (the compatible path).
//
// Plugin configuration (JSON, all fields optional):
//
//	{"mode":"approximate","blockSize":16,"maxPrefixBlocks":256,
//	 "maxBodyBytes":8388608,"denseBlocks":256,"hashSeed":""}
//
// approximate (default) hashes the prompt text the way GIE's
// prefix-cache-scorer does (internal/prefixhash, blocks of blockSize×4
// bytes, seeded with model and cache_salt). precise reproduces vLLM's
// sha256_cbor block hashes (internal/kvhash) over the token ids vLLM will
// compute (internal/tokenizer, chat template included), so they match the
// servers' KV events; it needs hashSeed (the servers' PYTHONHASHSEED) and
// the model's tokenizer in the VM configuration, since a wasm VM cannot
// read files:
//
//	{"tokenizer":<tokenizer.json>,"tokenizerConfig":<tokenizer_config.json>}
//
// A VM callback cannot be interrupted, so precise mode tokenizes only the
// prompt's first maxPrefixBlocks×blockSize tokens (internal/prompt
// TokensUpTo): a prompt of megabytes costs what one filling the blocks
// costs, and x-kvgate-prompt-len is then an estimate above that cap.
//
// LoRA adapters are not mixed into precise hashes: the filter cannot tell an
// adapter name from a base model name.
//
// maxBodyBytes must not exceed the proxy's per-request buffer limit (Envoy:
// per_connection_buffer_limit_bytes), or the proxy answers 413 before the
// filter can let the request pass untagged.
package main
