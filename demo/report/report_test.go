package report

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo/workload"
)

func TestPercentile(t *testing.T) {
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ q, want float64 }{{0.5, 5}, {0.9, 9}, {0.99, 10}, {0, 1}, {1, 10}} {
		if got := Percentile(vals, tc.q); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.q, got, tc.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 0.5)) {
		t.Error("empty input should give NaN")
	}
}

func sampleRun(policy string) Run {
	r := Run{Policy: policy, Wall: 10 * time.Second}
	for i := range 10 {
		r.Results = append(r.Results, workload.Result{Index: i, TTFT: time.Duration(i+1) * 100 * time.Millisecond,
			Latency: 2 * time.Second, PromptTokens: 100, CachedTokens: 50, CompletionTokens: 10})
	}
	r.Results = append(r.Results, workload.Result{Index: 10, Err: "HTTP 500"})
	r.Endpoints = []Endpoint{
		{Name: "sim-0", Requests: 3, CacheHits: 30, CacheQueries: 100, Samples: []Sample{{T: time.Second, Waiting: 1, Running: 2}}},
		{Name: "sim-1", Requests: 7, CacheHits: 60, CacheQueries: 100},
	}
	return r
}

func TestSummarize(t *testing.T) {
	s := Summarize(sampleRun("p"))
	want := Summary{Policy: "p", Requests: 11, Errors: 1, TTFTP50: 0.5, TTFTP90: 0.9, TTFTP99: 1.0,
		RequestsPerSec: 5, OutputTokensPerSec: 50, HitRate: 0.45, ClientCachedRate: 0.5, Share: []float64{0.3, 0.7}}
	got, _ := json.Marshal(s)
	exp, _ := json.Marshal(want)
	if string(got) != string(exp) {
		t.Fatalf("summary\n got %s\nwant %s", got, exp)
	}
	// A run where everything failed has no percentiles and still encodes.
	none := Summarize(Run{Policy: "x", Results: []workload.Result{{Err: "down"}}})
	if _, err := json.Marshal(none); err != nil || none.TTFTP50 != 0 {
		t.Fatalf("all-failed summary %+v: %v", none, err)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, []Summary{none}); err != nil || !strings.Contains(b.String(), "0/1") || !strings.Contains(b.String(), " - ") {
		t.Fatalf("table for failed run:\n%s", b.String())
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, []Summary{Summarize(sampleRun("round-robin")), Summarize(sampleRun("precise"))}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"TTFT p50", "round-robin", "10/11", "500 ms", "900 ms", "5.0", "45.0%", "30% 70%"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteHTMLIsSelfContainedAndEscaped(t *testing.T) {
	runs := []Run{sampleRun("<b>rr</b>"), sampleRun("precise")}
	var b bytes.Buffer
	err := WriteHTML(&b, Page{Title: "t", Generated: time.Unix(0, 0), Setup: []string{"4 sims"}, Runs: runs,
		Summaries: []Summary{Summarize(runs[0]), Summarize(runs[1])}})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "<b>rr</b>") || !strings.Contains(out, "&lt;b&gt;rr&lt;/b&gt;") {
		t.Error("policy name not escaped")
	}
	if n := strings.Count(out, "<svg"); n != 3 { // the CDF and one load plot per run
		t.Errorf("%d plots, want 3", n)
	}
	for _, banned := range []string{"<script", "src=", "href="} {
		if strings.Contains(out, banned) {
			t.Errorf("report references %q: not self-contained", banned)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{{0, 1}, {0.3, 0.3}, {1, 1}, {1.2, 1.5}, {730, 800}, {4.9, 5}, {5600, 6000}, {math.Inf(1), 1}} {
		if got := niceCeil(tc.in); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("niceCeil(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestTicksFallOnRoundSteps(t *testing.T) {
	for _, tc := range []struct {
		max  float64
		want int
	}{{1, 5}, {8000, 4}, {6000, 6}, {60, 6}, {30, 6}, {1.5, 6}, {3, 6}, {2.5, 5}, {400, 4}} {
		if got := ticks(tc.max); got != tc.want {
			t.Errorf("ticks(%v) = %d, want %d", tc.max, got, tc.want)
		}
	}
}

func TestWriteHTMLTelemetry(t *testing.T) {
	page := Page{Title: "t", Runs: []Run{sampleRun("precise")}, Summaries: []Summary{Summarize(sampleRun("precise"))},
		Telemetry: []Telemetry{
			{Policy: "precise", Node: "gpu-node-0", GPUAvailable: true,
				GPUs: []GPU{{Index: 3, Name: "NVIDIA H200 141GB HBM3e", UtilizationPercent: 97, MemoryUsedGiB: 120, MemoryTotal: 141,
					PowerWatts: 650, PowerLimit: 700, TemperatureCelsius: 88, Throttle: []string{"hw_thermal_slowdown"},
					XIDErrors: 2, LastXID: 79, Endpoints: []string{"10.0.0.5:8000"}}},
				Peers: []Peer{{Address: "10.0.0.6", Class: "nixl", Flows: 1, SRTTMs: 1.25, MBytes: 640, MBytesPerSec: 9800}}},
			{Policy: "round-robin", Node: "local", Reason: "nvmlInit: ERROR_LIBRARY_NOT_FOUND"},
			{Policy: "load", Err: "connection refused"},
		}}
	var b bytes.Buffer
	if err := WriteHTML(&b, page); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"Network and GPUs", "node gpu-node-0", "NVIDIA H200 141GB HBM3e", "97%", "120.0 / 141.0",
		"hw_thermal_slowdown", "2 (79)", "10.0.0.5:8000", "<td>10.0.0.6</td><td>nixl</td>", "1.250", "9800.0",
		"none on this machine (nvmlInit: ERROR_LIBRARY_NOT_FOUND)", "no peer measured", "No telemetry: connection refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	page.Telemetry, page.NoAgent = nil, "no kvgate-agent"
	b.Reset()
	if err := WriteHTML(&b, page); err != nil || !strings.Contains(b.String(), "No node agent ran: no kvgate-agent") {
		t.Errorf("report without an agent: %v", err)
	}
}

func TestITL(t *testing.T) {
	for _, tc := range []struct {
		res  workload.Result
		want float64
		ok   bool
	}{
		{workload.Result{TTFT: time.Second, Latency: 3 * time.Second, CompletionTokens: 5}, 0.5, true},
		{workload.Result{TTFT: time.Second, Latency: time.Second, CompletionTokens: 1}, 0, false},
	} {
		if got, ok := ITL(tc.res); got != tc.want || ok != tc.ok {
			t.Errorf("ITL(%+v) = %v, %v; want %v, %v", tc.res, got, ok, tc.want, tc.ok)
		}
	}
}

// A scenario's own tables and figures, and the ITL distribution, appear
// escaped and as inline plots.
func TestWriteHTMLTablesAndFigures(t *testing.T) {
	runs := []Run{sampleRun("collocated-3"), sampleRun("1P2D")}
	page := Page{Title: "t", Runs: runs, Summaries: []Summary{Summarize(runs[0]), Summarize(runs[1])}, ITL: true,
		Tables:  []Table{{Title: "P/D pairs", Header: []string{"prefill", "decode"}, Rows: [][]string{{"<p0>", "d1"}}, Note: "from the sidecars"}},
		Figures: []Figure{{Title: "sizes", XLabel: "MB", YLabel: "share", YMax: 1, Curves: []Curve{{Name: "d1", Points: [][2]float64{{1, 0.5}, {2, 1}}}}}}}
	var b bytes.Buffer
	if err := WriteHTML(&b, page); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"<h2>P/D pairs</h2>", "<th>prefill</th>", "<td>&lt;p0&gt;</td><td>d1</td>", "from the sidecars",
		"Inter-token latency per request", ">sizes</text>"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// TTFT and ITL distributions, the figure, one load plot per run.
	if n := strings.Count(out, "<svg"); n != 5 {
		t.Errorf("%d plots, want 5", n)
	}
}
