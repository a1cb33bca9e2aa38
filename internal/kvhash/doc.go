// Package kvhash computes vLLM's prefix-cache block hashes byte for byte
// (the sha256_cbor algorithm), so that kvgate can name the KV blocks a prompt
// will occupy on a vLLM server before the server has seen it, and match them
// against the hashes vLLM publishes in its KV-cache events.
//
// A prompt's token ids are cut into full blocks of BlockSize tokens (the
// trailing partial block has no hash). Each block's hash covers its parent's
// hash, so one hash names the whole prefix that ends with its block:
//
//	none = SHA256(CBOR(text(seed)))
//	h_i  = SHA256(CBOR([bytes(h_{i-1} or none), [token ids...], null | [extra keys...]]))
//
// The extra keys are the LoRA adapter name (every block) and the request's
// cache salt (block 0 only). vLLM's events carry the low 64 bits of each
// digest, read big-endian from its last 8 bytes (Hash.Uint64).
//
// The package is pure Go with no dependencies outside the standard library so
// that it builds for GOOS=wasip1 (the proxy-wasm filter) too.
package kvhash
