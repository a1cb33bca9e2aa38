package testutil

import (
	"runtime/debug"
	"testing"

	"github.com/kvgate/kvgate/internal/memlimit"
)

// MemoryLimitCase is a command line and the runtime memory limit it must
// set when the environment has no GOMEMLIMIT.
type MemoryLimitCase struct {
	Args []string
	Want int64
}

// ApplyMemoryLimit is a command's memory-limit application: the limit set
// and where it came from, with getenv in place of os.Getenv.
type ApplyMemoryLimit func(getenv func(string) string) (int64, memlimit.Source)

// MemoryLimitFlag checks a command's --memory-limit end to end: each
// case's arguments, read by parse, set the runtime's limit to Want;
// GOMEMLIMIT in the environment wins over --memory-limit 1GiB; and
// --memory-limit bad is refused. The runtime's limit is restored when the
// test ends.
func MemoryLimitFlag(t *testing.T, parse func(args []string) (ApplyMemoryLimit, error), cases []MemoryLimitCase, bad string) {
	t.Helper()
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	noEnv := func(string) string { return "" }
	for _, tc := range cases {
		apply, err := parse(tc.Args)
		if err != nil {
			t.Fatalf("%v: %v", tc.Args, err)
		}
		if got, _ := apply(noEnv); got != tc.Want {
			t.Errorf("%v: ApplyMemoryLimit = %d, want %d", tc.Args, got, tc.Want)
		}
		if got := debug.SetMemoryLimit(-1); got != tc.Want {
			t.Errorf("%v: runtime limit %d, want %d", tc.Args, got, tc.Want)
		}
	}
	apply, err := parse([]string{"--memory-limit", "1GiB"})
	if err != nil {
		t.Fatal(err)
	}
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
	if _, err := parse([]string{"--memory-limit", bad}); err == nil {
		t.Errorf("--memory-limit %s accepted", bad)
	}
}
