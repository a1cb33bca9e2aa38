package benchmarks

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/sim/engine"
)

// `kvgate bench pd` runs both scenarios and writes their tables; with an
// always-disaggregating decider every request is P/D, and collocated
// fleets none.
func TestPDBench(t *testing.T) {
	dir := t.TempDir()
	args := []string{"pd", "--out", dir, "--preset", "qwen3-0.6b-h100", "--requests", "12", "--thresholds", "64,4096"}
	if err := Main(context.Background(), args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "pd.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(string(md), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 16 || strings.HasPrefix(line, "| fleet") || strings.HasPrefix(line, "|---") {
			continue
		}
		rows++
		fleet, decider, share, ok := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2]), strings.TrimSpace(cells[14]), strings.TrimSpace(cells[6])
		if ok != "12/12" {
			t.Errorf("%s %s: %s requests ok", fleet, decider, ok)
		}
		// The mean TTFT by prompt length: "–" for a bucket without
		// requests; a workload of one prompt length fills one bucket,
		// whose mean is the overall mean.
		parts := strings.Split(strings.TrimSuffix(strings.TrimSpace(cells[16]), "s"), " / ")
		filled := []string{}
		for _, p := range parts {
			if p != "–" {
				filled = append(filled, p)
			}
		}
		mean := strings.TrimSuffix(strings.TrimSpace(cells[9]), "s")
		switch w := strings.TrimSpace(cells[3]); {
		case len(parts) != 3 || len(filled) == 0:
			t.Errorf("%s %s: TTFT by class %q", fleet, decider, cells[16])
		case w != "mixed" && (len(filled) != 1 || filled[0] != mean):
			t.Errorf("%s %s %s: TTFT by class %q, want only the mean %s", fleet, decider, w, cells[16], mean)
		}
		switch {
		case strings.Contains(fleet, "collocated") && share != "0%":
			t.Errorf("collocated fleet disaggregated %s", share)
		case decider == "always-disagg-pd-decider" && share != "100%":
			t.Errorf("always-disagg-pd-decider disaggregated %s", share)
		}
	}
	// tradeoff: 2 workloads × (collocated + 4 deciders × 2 networks);
	// sweep: 4 networks × (5 transfer-cost + 2 thresholds).
	if rows != 18+28 {
		t.Errorf("%d rows:\n%s", rows, md)
	}
}

func TestPDUsage(t *testing.T) {
	for _, bad := range [][]string{
		{"pd"},
		{"pd", "--out", "x", "--scenario", "nope"},
		{"pd", "--out", "x", "--prefill", "4"},
		{"pd", "--out", "x", "--thresholds", "0"},
		{"pd", "--out", "x", "--slow-bw", "0"},
	} {
		if err := Main(context.Background(), bad, io.Discard, io.Discard); !errors.Is(err, ErrUsage) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
}

// The transfer-cost decider's choices in the simulated 2P2D fleet follow
// the trade-off: long prompts over a fast network disaggregate (most of
// them, enough to take P/D's ITL gain), long ones over a slow network and
// short ones over either mostly do not.
func TestPDDecisionPattern(t *testing.T) {
	o := DefaultPDOptions()
	o.Requests = 80
	preset, _ := engine.LookupPreset(o.Preset)
	fleets, err := o.fleets(preset, "transfer-cost-pd-decider")
	if err != nil {
		t.Fatal(err)
	}
	long := pdWorkload(o.Seed, o.Requests, o.QPSLong, fixedLen(8000), fixedLen(256), 0, 0, 0)
	short := pdWorkload(o.Seed, o.Requests, o.QPSShort, fixedLen(256), fixedLen(256), 0, 0, 0)
	for _, c := range []struct {
		name     string
		reqs     []workload.Request
		net      pdNetwork
		min, max float64 // bounds of the share disaggregated
	}{
		{"long, fast", long, o.uniform("fast", o.FastBW), 0.75, 1},
		{"long, slow", long, o.uniform("slow", o.SlowBW), 0, 0.1},
		{"short, fast", short, o.uniform("fast", o.FastBW), 0, 0.1},
		{"short, slow", short, o.uniform("slow", o.SlowBW), 0, 0.05},
	} {
		t.Run(c.name, func(t *testing.T) {
			row, err := o.run(t.Context(), preset, fleets[0], c.net, c.name, 0, c.reqs, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%.0f%% disaggregated", 100*row.Disagg)
			if row.Failed > 0 || row.Disagg < c.min || row.Disagg > c.max {
				t.Errorf("%d failed, %.0f%% disaggregated, want %.0f–%.0f%%", row.Failed, 100*row.Disagg, 100*c.min, 100*c.max)
			}
		})
	}
}
