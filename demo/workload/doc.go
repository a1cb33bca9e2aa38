// Package workload turns the Mooncake trace into a replayable, scaled-down
// request stream and replays it against an OpenAI-compatible endpoint,
// measuring time to first token at the client.
//
// Scaling, so that a demo on a laptop stays cheap yet keeps the trace's
// shape:
//   - Each 512-token trace block becomes WordsPerBlock words of text
//     (64 by default, about 64 Qwen3 tokens: 1/8 of the block), generated deterministically from the block's
//     hash id: equal ids give identical chunks, so the trace's shared
//     prefixes stay shared, token for token.
//   - Prompts are capped at Options.MaxBlocks blocks and output lengths at
//     Options.MaxOutputTokens.
//   - Arrival times keep their order and burstiness but are compressed to
//     Options.Duration.
//   - The trace spreads its prefix sharing over 17 minutes: among its
//     first 200 requests only 6% of the blocks repeat. Select therefore takes the
//     requests of the most-shared prefix groups (equal first block id: a
//     conversation or a common system prompt), in trace order, so a short
//     run sees the multi-turn reuse the full trace has.
package workload
