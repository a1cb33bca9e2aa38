// Package prefixmatch is what the picker's prefix-cache scorers share and
// the scheduling framework does not need to know: how a sampled prefix
// (internal/hints) is matched, and how a scorer's expectation of cached
// tokens is recorded and later checked against the server's usage report;
// and the buffers a scorer hashes a prompt into, which it hands back at the
// decision (Hashing).
//
// It lives beside the scorers rather than in internal/hints because hints
// is the wire format the wasm filter compiles too, while predictions are
// about picker endpoints and scheduling results.
package prefixmatch
