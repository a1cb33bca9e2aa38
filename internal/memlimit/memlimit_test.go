package memlimit

import (
	"flag"
	"io"
	"math"
	"runtime/debug"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "auto", want: Auto},
		{in: "AUTO", want: Auto},
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512MiB", want: 512 << 20},
		{in: "2GiB", want: 2 << 30},
		{in: "3G", want: 3 << 30},
		{in: "64K", want: 64 << 10},
		{in: "-1", bad: true},
		{in: "lots", bad: true},
		{in: "1.5GiB", bad: true},
		{in: "9223372036854775807GiB", bad: true},
		{in: "", bad: true},
	} {
		got, err := Parse(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("Parse(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct{ limit, budget, want int64 }{
		{Auto, 256 << 20, 512 << 20},
		{Auto, -1, 0},
		{0, 256 << 20, 0},
		{1 << 30, 256 << 20, 1 << 30},
	} {
		if got := Resolve(tc.limit, tc.budget); got != tc.want {
			t.Errorf("Resolve(%d, %d) = %d, want %d", tc.limit, tc.budget, got, tc.want)
		}
	}
}

func TestFlagValue(t *testing.T) {
	n := int64(Auto)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(Value{&n}, "memory-limit", "")
	if got := fs.Lookup("memory-limit").Value.String(); got != "auto" {
		t.Fatalf("default prints %q, want auto", got)
	}
	if err := fs.Parse([]string{"--memory-limit", "768MiB"}); err != nil || n != 768<<20 {
		t.Fatalf("parse: %d, %v", n, err)
	}
	if err := fs.Parse([]string{"--memory-limit", "huge"}); err == nil {
		t.Fatal("a bad value parsed")
	}
}

// TestApply changes the process's memory limit; it restores it at the end
// and does not run in parallel.
func TestApply(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	noEnv := func(string) string { return "" }

	if got, src := Apply(700<<20, noEnv); got != 700<<20 || src != FromFlag {
		t.Fatalf("Apply = %d %s", got, src)
	}
	if got := debug.SetMemoryLimit(-1); got != 700<<20 {
		t.Fatalf("runtime limit %d after Apply(700MiB)", got)
	}
	if got, src := Apply(0, noEnv); got != math.MaxInt64 || src != None || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Fatalf("Apply(0) = %d %s, runtime %d", got, src, debug.SetMemoryLimit(-1))
	}
	// With GOMEMLIMIT set the runtime's value (as the runtime parsed it
	// at start) is kept, whatever the flag says.
	debug.SetMemoryLimit(900 << 20)
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "900MiB"
		}
		return ""
	}
	if got, src := Apply(100<<20, env); got != 900<<20 || src != FromEnv {
		t.Fatalf("Apply with GOMEMLIMIT = %d %s", got, src)
	}
	if got := debug.SetMemoryLimit(-1); got != 900<<20 {
		t.Fatalf("GOMEMLIMIT lost: runtime limit %d", got)
	}
}
