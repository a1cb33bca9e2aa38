package benchmarks

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		switch {
		case strings.Contains(fleet, "collocated") && share != "0%":
			t.Errorf("collocated fleet disaggregated %s", share)
		case decider == "always-disagg-pd-decider" && share != "100%":
			t.Errorf("always-disagg-pd-decider disaggregated %s", share)
		}
	}
	// tradeoff: 2 workloads × (collocated + 3 deciders × 2 networks);
	// sweep: 4 networks × (2 transfer-cost + 2 thresholds).
	if rows != 14+16 {
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
