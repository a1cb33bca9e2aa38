//go:build race

package testutil

// RaceEnabled reports a -race build: the race detector adds allocations
// (and sync.Pool drops items at random under it), so tests that pin
// allocation counts skip.
const RaceEnabled = true
