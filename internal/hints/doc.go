// Package hints is the header encoding between kvgate's proxy-wasm filter
// (the writer, in the data plane where the body bytes are) and the picker
// (the reader): the filter parses and hashes the OpenAI body once and the
// picker routes on these headers alone, so its cost does not grow with the
// prompt.
//
// Headers (all values are printable ASCII):
//
//	x-kvgate-model       model name, percent-encoded outside visible ASCII
//	x-kvgate-stream      "true" or "false"
//	x-kvgate-prompt-len  prompt length in tokens: exact in precise mode,
//	                     an estimate (bytes/4, rounded up) otherwise
//	x-kvgate-max-tokens  requested output limit; absent when the body has none
//	x-kvgate-prefix      prefix block hashes, see below
//
// x-kvgate-prefix is "1;m=<a|p>;b=<block tokens>;s=<seed, 16 hex>;n=<blocks>;k=<dense>;h=<hashes>":
// mode approximate (chained xxhash64 over text blocks of b×4 bytes) or
// precise (vLLM block hashes over b tokens), the seed that starts the chain
// (approximate: prefixhash.Seed(model, cache_salt); precise: the event value
// of vLLM's NONE_HASH for the servers' PYTHONHASHSEED; both sides must agree
// on it), the number n of hashed blocks, and the
// hashes of a sample of those blocks, each the 8 big-endian bytes in
// unpadded base64url (11 characters), concatenated in index order.
//
// The sample's block indices are not sent because they follow from n and
// k: every block below k, then k blocks at stride 2, k at stride 4, and so
// on (region j starts at (2^j−1)·k with stride 2^j), and always the last
// block n−1. Chained hashes identify a whole prefix, so the longest matching
// sample bounds the cached prefix: the match length is exact below k and
// otherwise underestimated by less than one stride, i.e. by less than 1/k of
// the matched length. The writer picks the largest k (up to its configured
// dense limit) whose sample fits in MaxSamples, which keeps the header under
// 7 KB for any n up to MaxBlocks (a 1M-token prompt in 16-token blocks has
// 62,500 blocks and gets k=59, 594 samples, 6.6 KB).
//
// Anything malformed decodes to an error, never a panic: the headers cross
// a trust boundary, and the filter strips client-sent x-kvgate-* headers
// before it writes its own.
//
// The package uses only the standard library so that it builds for
// GOOS=wasip1.
package hints
