package testutil

import (
	"runtime/debug"
	"testing"

	"github.com/kvgate/kvgate/internal/memlimit"
)

// MemoryLimitEnvWins checks a command's memory-limit application (apply,
// parsed with --memory-limit 1GiB) against GOMEMLIMIT=2GiB: the
// environment's limit, which the runtime took at start, must stay.
func MemoryLimitEnvWins(t *testing.T, apply func(getenv func(string) string) (int64, memlimit.Source)) {
	t.Helper()
	debug.SetMemoryLimit(2 << 30) // what the runtime took from GOMEMLIMIT=2GiB
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "2GiB"
		}
		return ""
	}
	if got, src := apply(env); got != 2<<30 || src != memlimit.FromEnv || debug.SetMemoryLimit(-1) != 2<<30 {
		t.Errorf("with GOMEMLIMIT: %d from %s, runtime %d", got, src, debug.SetMemoryLimit(-1))
	}
}
