package demo

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo/report"
	"github.com/kvgate/kvgate/demo/workload"
)

func TestSizeCurve(t *testing.T) {
	// From the last empty bucket to the first full one.
	c, ok := sizeCurve(PDTransfers{Decode: "d0", Sizes: map[string]float64{"1000": 0, "5e+05": 0, "1e+06": 2, "4e+06": 5, "1.6e+07": 5, "+Inf": 5, "bad": 9}})
	want := [][2]float64{{0.5, 0}, {1, 0.4}, {4, 1}}
	if !ok || c.Name != "d0" || fmt.Sprint(c.Points) != fmt.Sprint(want) {
		t.Errorf("curve %+v, %v; want points %v", c, ok, want)
	}
	if _, ok := sizeCurve(PDTransfers{Decode: "d1", Sizes: map[string]float64{"1e+06": 0, "+Inf": 0}}); ok {
		t.Error("a server without transfers has a curve")
	}
}

// The P/D report shows both fleets' TTFT and ITL, the pairs, each decode
// server's transfers and their size distribution.
func TestPDPage(t *testing.T) {
	run := func(name string, itl time.Duration) report.Run {
		r := report.Run{Policy: name, Wall: time.Second}
		for i := range 4 {
			r.Results = append(r.Results, workload.Result{Index: i, TTFT: 20 * time.Millisecond, Latency: 20*time.Millisecond + 9*itl, CompletionTokens: 10})
		}
		return r
	}
	runs := []report.Run{run("collocated-3", 8*time.Millisecond), run("1P2D", 6*time.Millisecond)}
	sums := []PDSummary{summarizePD(runs[0]), summarizePD(runs[1])}
	pr := PDReport{Pairs: []PDPair{{Prefill: "sim-p0", Decode: "sim-d0", Requests: 3}, {Prefill: "sim-p0", Decode: "sim-d1", Requests: 1}},
		Transfers: []PDTransfers{
			{Decode: "sim-d0", Pulls: 3, Bytes: 3 << 20, BytesPerPull: 1 << 20, Sizes: map[string]float64{"1e+06": 1, "4e+06": 3, "+Inf": 3}},
			{Decode: "sim-d1", Pulls: 1, Bytes: 2 << 20, BytesPerPull: 2 << 20, Sizes: map[string]float64{"1e+06": 0, "4e+06": 1, "+Inf": 1}},
		}}
	o := DefaultOptions()
	page := pdPage(o, PDShape{Prefill: 1, Decode: 2}, runs, sums, pr, 1<<20)
	var b bytes.Buffer
	if err := report.WriteHTML(&b, page); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"kvgate up --pd 1P2D", "<td>collocated-3</td><td>4 / 4</td><td>20</td><td>20</td><td>8.0</td><td>8.0</td>",
		"<td>1P2D</td><td>4 / 4</td><td>20</td><td>20</td><td>6.0</td><td>6.0</td>",
		"<td>sim-p0</td><td>sim-d0</td><td>3</td>", "<td>sim-d1</td><td>1</td><td>2097152</td><td>2097152</td><td>2.0</td>",
		"Bytes per transfer", ">sim-d1</text>", "Inter-token latency"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
