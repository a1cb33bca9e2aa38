package testutil

import (
	"testing"
	"time"
)

// WaitTimeout bounds WaitFor: a guard against a hang, generous enough for
// a loaded machine running the suite with -race, never a measurement.
const WaitTimeout = 20 * time.Second

// WaitFor polls cond every few milliseconds until it holds, failing the
// test when it still does not after WaitTimeout; what names the awaited
// state in that failure.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
