// Package tokenizer is a pure-Go implementation of the Hugging Face
// tokenizer.json format for byte-level BPE models (Qwen2/Qwen3, Llama 3 and
// GPT-4-style pre-tokenizers), plus the model's chat template.
//
// The picker needs the exact token ids vLLM will compute for a prompt so that
// it can reproduce vLLM's prefix-cache block hashes; an approximation would
// hash different blocks and never match. The package therefore mirrors the
// Rust tokenizers crate step by step: added-token splitting on the raw text,
// NFC normalisation, the split regex (hand-written here because Go's regexp
// has no look-ahead and is too slow for the hot path), byte-level mapping and
// rank-ordered BPE merges.
//
// Nothing here uses cgo or os/exec, so the package also builds for
// GOOS=wasip1 GOARCH=wasm and runs inside the proxy-wasm filter.
//
// A Tokenizer is immutable after loading and safe for concurrent use; its
// word cache and the PrefixCache are bounded.
package tokenizer
