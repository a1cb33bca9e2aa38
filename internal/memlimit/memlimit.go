package memlimit

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// Headroom is what Auto adds to the body budget: the heap the process uses
// besides buffered bodies (indexes, connections, metrics, the runtime).
const Headroom = 256 << 20

// Auto is the flag value that derives the limit from the budget.
const Auto = -1

// Value is a --memory-limit flag: "auto" (Auto), 0 for none, or a size in
// bytes with an optional KiB/MiB/GiB (or K/M/G, powers of 1024) suffix.
type Value struct{ N *int64 }

func (v Value) String() string {
	if v.N == nil || *v.N == Auto {
		return "auto"
	}
	return strconv.FormatInt(*v.N, 10)
}

func (v Value) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*v.N = n
	return nil
}

// Parse reads a --memory-limit value.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "auto") {
		return Auto, nil
	}
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("memory limit %q: want auto, 0 (none) or a byte count such as 1536MiB", s)
	}
	return n * mult, nil
}

// Resolve is the limit a flag value means for a body budget: Auto is the
// budget plus Headroom, or none (0) when the budget is unlimited.
func Resolve(limit, budget int64) int64 {
	if limit != Auto {
		return limit
	}
	if budget < 0 {
		return 0
	}
	return budget + Headroom
}

// Source says where the limit in force came from.
type Source string

const (
	FromFlag Source = "flag"
	FromEnv  Source = "GOMEMLIMIT"
	None     Source = "none"
)

// Apply sets the process's soft memory limit to limit bytes (0: none)
// unless getenv("GOMEMLIMIT") is set, in which case the runtime already
// applied that one and it is kept. It returns the limit in force.
func Apply(limit int64, getenv func(string) string) (int64, Source) {
	if getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1), FromEnv
	}
	if limit <= 0 {
		debug.SetMemoryLimit(math.MaxInt64)
		return math.MaxInt64, None
	}
	debug.SetMemoryLimit(limit)
	return limit, FromFlag
}
