// Package seriescache keeps the Prometheus series that hot paths write,
// resolved once per label set: every WithLabelValues hashes its labels and
// takes its vector's lock, and a request of the picker writes dozens of
// series (the request metrics of extproc/metrics, the flow-control layer's
// of extproc/flowcontrol). A Cache maps a label set, already bounded by its
// owner, to a value holding those series.
//
// Bounded: at most Max entries. Past it a new label set evicts one chosen
// at random (Go's map order), which needs no bookkeeping on a hit, as an
// LRU would (a write per read on the hot path); an evicted set is resolved
// again when next used, and since WithLabelValues returns the series its
// vector already holds, nothing is lost but that time.
package seriescache
