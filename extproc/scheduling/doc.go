// Package scheduling is the picker's Filter → Score → Pick framework.
//
// A Scheduler runs scheduling profiles chosen by a ProfileHandler. Each
// Profile narrows the candidate endpoints with its Filters, adds up its
// Scorers' weighted scores (Σ weight × score, not normalised, each score in
// [0, 1]) and lets its Picker choose the targets. Plugins are built by type
// name from configuration through a Registry; request-lifecycle hooks
// (PreRequest, response observers) let plugins track what they routed.
//
// The framework is allocation-lean on the hot path: per-request scratch
// buffers come from a sync.Pool and scores are dense slices aligned with the
// candidate list rather than maps.
package scheduling
