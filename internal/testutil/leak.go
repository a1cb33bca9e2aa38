package testutil

import (
	"runtime"
	"testing"
	"time"
)

// NoGoroutineLeak fails tb when more goroutines run than before once the
// ones that are exiting have had five seconds to finish; the failure
// lists every goroutine's stack. what names the step that should have
// stopped them.
func NoGoroutineLeak(tb testing.TB, before int, what string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > before {
		buf := make([]byte, 1<<20)
		tb.Fatalf("%d goroutines after %s, %d before:\n%s", n, what, before, buf[:runtime.Stack(buf, true)])
	}
}
