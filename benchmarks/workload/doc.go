// Package workload produces the request streams the cluster benchmark
// replays: Mooncake traces, llm-d's shared-prefix benchmark shape and a
// multi-turn chat generator.
//
// A prompt is described by segments rather than stored as token ids, so
// that a 4,000-request trace of 15k-token prompts costs kilobytes until a
// request is sent. Each segment expands deterministically from its key:
// equal keys give identical token blocks, which is what makes caches and
// block hashes behave as they would on real text.
package workload
