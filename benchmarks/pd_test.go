package benchmarks

import (
	"context"
	"errors"
	"io"
	"math"
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
		{"pd", "--out", "x", "--scenario", "capacity", "--rates", "2,1"},
		{"pd", "--out", "x", "--scenario", "capacity", "--rates", "1,0"},
		{"pd", "--out", "x", "--scenario", "capacity", "--slo-tpot", "0s"},
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
	long := o.longPrompts(o.QPSLong)
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

// `kvgate bench pd --scenario capacity` runs every tradeoff fleet at every
// rate (a collocated fleet once, the others over both networks) and finds
// each one's capacity; raising the rate raises the throughput, and a looser
// SLO never lowers a capacity.
func TestPDCapacity(t *testing.T) {
	dir := t.TempDir()
	args := []string{"pd", "--out", dir, "--scenario", "capacity", "--preset", "qwen3-0.6b-h100", "--requests", "12", "--rates", "1,4"}
	if err := Main(context.Background(), args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "pd.md"))
	if err != nil {
		t.Fatal(err)
	}
	summary, runs := 0, 0
	for _, line := range strings.Split(string(md), "\n") {
		switch cells := strings.Split(line, "|"); {
		case strings.HasPrefix(line, "| fleet") || strings.HasPrefix(line, "|---") || len(cells) < 2:
		case len(cells) == 10:
			summary++
		case len(cells) == 18:
			runs++
		default:
			t.Errorf("unexpected table line %q", line)
		}
	}
	// 1 collocated + 4 xPyD deciders × 2 networks; each at 2 rates.
	if summary != 9 || runs != 18 || !strings.Contains(string(md), "SLO TTFT p90 <= 1s and TPOT p90 <= 25ms") {
		t.Errorf("%d capacity rows, %d runs:\n%s", summary, runs, md)
	}

	o := DefaultPDOptions()
	o.Preset, o.Requests = "qwen3-0.6b-h100", 12
	preset, _ := engine.LookupPreset(o.Preset)
	rows, err := o.capacity(t.Context(), preset, []float64{1, 4}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	groups := byFleet(rows)
	if len(groups) != 9 {
		t.Fatalf("%d fleet × network groups", len(groups))
	}
	for _, g := range groups {
		name := g[0].Fleet + " " + g[0].Decider + " " + g[0].Network
		if len(g) != 2 || g[0].QPS != o.QPSLong || g[1].QPS != 4*o.QPSLong {
			t.Fatalf("%s: runs %+v", name, g)
		}
		if g[1].OutTokS <= g[0].OutTokS {
			t.Errorf("%s: %.0f out tok/s at 4x the rate, %.0f at 1x", name, g[1].OutTokS, g[0].OutTokS)
		}
		// No bound: the highest rate; bounds below the lowest rate's p90s:
		// none; the loosest p90s of the sweep: the highest rate again.
		loose := pdSLO{max(g[0].TTFTP90, g[1].TTFTP90), max(g[0].TPOTP90, g[1].TPOTP90)}
		slos := []pdSLO{{0, 0}, {g[0].TTFTP90 / 2, math.Inf(1)}, {math.Inf(1), g[0].TPOTP90 / 2}, o.slo(), loose, {math.Inf(1), math.Inf(1)}}
		prev := -1.0
		for i, s := range slos {
			r, ok := capacityOf(g, s)
			rate := 0.0
			if ok {
				rate = r.QPS
			}
			switch {
			case i < 3 && ok:
				t.Errorf("%s: capacity %.3g under %+v, below the lowest rate's p90s", name, rate, s)
			case i >= 4 && rate != g[1].QPS:
				t.Errorf("%s: capacity %.3g under %+v, want the highest rate", name, rate, s)
			case rate < prev:
				t.Errorf("%s: a looser SLO %+v lowered the capacity to %.3g from %.3g", name, s, rate, prev)
			}
			prev = rate
		}
	}
}

// A fleet's capacity is the highest rate that met the SLO with every lower
// one meeting it: a rate met after a miss does not count, and a run with a
// failed request misses.
func TestCapacityOf(t *testing.T) {
	run := func(qps, ttft, tpot float64, failed int) pdRow {
		return pdRow{QPS: qps, OK: 10, Failed: failed, TTFTP90: ttft, TPOTP90: tpot}
	}
	s := pdSLO{1, 0.025}
	for _, c := range []struct {
		name string
		runs []pdRow
		want float64 // 0: none
	}{
		{"all met", []pdRow{run(1, 0.2, 0.01, 0), run(2, 0.5, 0.02, 0), run(3, 1, 0.025, 0)}, 3},
		{"TTFT missed", []pdRow{run(1, 0.2, 0.01, 0), run(2, 1.2, 0.02, 0)}, 1},
		{"TPOT missed", []pdRow{run(1, 0.2, 0.01, 0), run(2, 0.5, 0.03, 0)}, 1},
		{"met again after a miss", []pdRow{run(1, 0.2, 0.01, 0), run(2, 0.5, 0.03, 0), run(3, 0.5, 0.02, 0)}, 1},
		{"a failed request", []pdRow{run(1, 0.2, 0.01, 1), run(2, 0.5, 0.02, 0)}, 0},
		{"none served", []pdRow{{QPS: 1}}, 0},
	} {
		r, ok := capacityOf(c.runs, s)
		if got := map[bool]float64{true: r.QPS}[ok]; got != c.want {
			t.Errorf("%s: capacity %v (%v), want %v", c.name, got, ok, c.want)
		}
	}
}
