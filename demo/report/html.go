package report

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/demo/workload"
)

// palette colours series; policies and endpoints cycle through it.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// Page is what the HTML report shows.
type Page struct {
	Title     string
	Generated time.Time
	// Setup lines describe the fleet and workload.
	Setup     []string
	Runs      []Run
	Summaries []Summary
	// Telemetry is the node agent's report per run; empty without an agent.
	Telemetry []Telemetry
	// NoAgent says why no agent ran, when none did.
	NoAgent string
	// ITL adds the inter-token latency's distribution beside TTFT's.
	ITL bool
	// Tables and Figures are a scenario's own results (the P/D fleet's
	// pairs and transfers), shown after the comparison.
	Tables  []Table
	Figures []Figure
}

// Table is a titled table of preformatted cells.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
	Note   string
}

// Figure is a line chart of named curves, each a list of (x, y) points.
type Figure struct {
	Title, XLabel, YLabel string
	// YMax is the y range the axis must cover.
	YMax   float64
	Curves []Curve
	Note   string
}

// Curve is one line of a Figure.
type Curve struct {
	Name   string
	Points [][2]float64
}

// cdf is each run's cumulative distribution of value over its successful
// requests (those value accepts), in milliseconds.
func cdf(runs []Run, value func(workload.Result) (float64, bool)) []series {
	var out []series
	for i, r := range runs {
		var vs []float64
		for _, res := range r.Results {
			if v, ok := value(res); ok && res.OK() {
				vs = append(vs, 1000*v)
			}
		}
		slices.Sort(vs)
		s := series{name: r.Policy, color: palette[i%len(palette)]}
		for j, v := range vs {
			s.pts = append(s.pts, [2]float64{v, float64(j+1) / float64(len(vs))})
		}
		out = append(out, s)
	}
	return out
}

func ttft(res workload.Result) (float64, bool) { return res.TTFT.Seconds(), true }

// ITL is a request's mean inter-token latency in seconds: its time after
// the first token over the tokens after the first; false for requests with
// fewer than two.
func ITL(res workload.Result) (float64, bool) {
	if res.CompletionTokens < 2 {
		return 0, false
	}
	return (res.Latency - res.TTFT).Seconds() / float64(res.CompletionTokens-1), true
}

type figurePlot struct {
	SVG  template.HTML
	Note string
}

// WriteHTML renders a self-contained report: no scripts, no external
// resources, plots as inline SVG.
func WriteHTML(w io.Writer, p Page) error {
	var itl template.HTML
	if p.ITL {
		itl = lineChart(chart{title: "Inter-token latency per request, cumulative distribution", xLabel: "mean inter-token latency (ms)",
			yLabel: "fraction of requests", yMax: 1, series: cdf(p.Runs, ITL)})
	}
	var figures []figurePlot
	for _, f := range p.Figures {
		c := chart{title: f.Title, xLabel: f.XLabel, yLabel: f.YLabel, yMax: f.YMax}
		for i, cv := range f.Curves {
			c.series = append(c.series, series{name: cv.Name, color: palette[i%len(palette)], pts: cv.Points})
		}
		figures = append(figures, figurePlot{lineChart(c), f.Note})
	}
	type queuePlot struct {
		Policy string
		SVG    template.HTML
	}
	var queues []queuePlot
	// Shared axes, so that the policies' plots compare at a glance.
	ymax, xmax := 1.0, 0.0
	for _, r := range p.Runs {
		for _, e := range r.Endpoints {
			for _, s := range e.Samples {
				ymax = max(ymax, s.Waiting+s.Running)
				xmax = max(xmax, s.T.Seconds())
			}
		}
	}
	for _, r := range p.Runs {
		var ss []series
		for i, e := range r.Endpoints {
			s := series{name: e.Name, color: palette[i%len(palette)]}
			for _, smp := range e.Samples {
				s.pts = append(s.pts, [2]float64{smp.T.Seconds(), smp.Waiting + smp.Running})
			}
			ss = append(ss, s)
		}
		queues = append(queues, queuePlot{r.Policy, lineChart(chart{
			title: r.Policy + ": requests in each server (waiting + running)", xLabel: "time (s)", yLabel: "requests",
			xMax: xmax, yMax: ymax, series: ss,
		})})
	}
	return page.Execute(w, map[string]any{
		"P": p,
		"CDF": lineChart(chart{title: "TTFT, cumulative distribution", xLabel: "time to first token (ms)",
			yLabel: "fraction of requests", yMax: 1, series: cdf(p.Runs, ttft)}),
		"ITL":     itl,
		"Figures": figures,
		"Queues":  queues,
	})
}

type series struct {
	name, color string
	pts         [][2]float64
}

type chart struct {
	title, xLabel, yLabel string
	// xMax and yMax are the data ranges the axes must cover; xMax 0
	// means the series' own range.
	xMax, yMax float64
	series     []series
}

// Plot geometry, in SVG user units.
const (
	plotW, plotH           = 760.0, 300.0
	marginL, marginR       = 64.0, 150.0
	marginT, marginB       = 34.0, 46.0
	innerW, innerH         = plotW - marginL - marginR, plotH - marginT - marginB
	maxPointsPerSeries int = 2000
)

// lineChart draws the series as polylines with axes, ticks and a legend.
func lineChart(c chart) template.HTML {
	xmax := c.xMax
	for _, s := range c.series {
		for _, p := range s.pts {
			xmax = max(xmax, p[0])
		}
	}
	xmax = niceCeil(xmax)
	ymax := niceCeil(c.yMax)
	x := func(v float64) float64 { return marginL + innerW*v/xmax }
	y := func(v float64) float64 { return marginT + innerH*(1-v/ymax) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`, plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14" font-weight="bold">%s</text>`, marginL, template.HTMLEscapeString(c.title))
	for i, n := 0, ticks(xmax); i <= n; i++ {
		xv := xmax * float64(i) / float64(n)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, x(xv), y(0), x(xv), y(ymax))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x(xv), y(0)+16, tick(xv))
	}
	for i, n := 0, ticks(ymax); i <= n; i++ {
		yv := ymax * float64(i) / float64(n)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, x(0), y(yv), x(xmax), y(yv))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, x(0)-6, y(yv)+4, tick(yv))
	}
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`, marginL, marginT, innerW, innerH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, marginL+innerW/2, plotH-8, template.HTMLEscapeString(c.xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`, marginT+innerH/2, template.HTMLEscapeString(c.yLabel))
	for i, s := range c.series {
		step := max(1, len(s.pts)/maxPointsPerSeries)
		var pts strings.Builder
		for j := 0; j < len(s.pts); j += step {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.pts[j][0]), y(min(s.pts[j][1], ymax)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, s.color, pts.String())
		ly := marginT + 10 + 18*float64(i)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`, plotW-marginR+12, ly, plotW-marginR+32, ly, s.color)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`, plotW-marginR+38, ly+4, template.HTMLEscapeString(s.name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // every interpolated string above is escaped
}

// niceCeil rounds v up to a round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
// times a power of ten) so that the five axis ticks fall on readable values.
func niceCeil(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// ticks is how many intervals split [0, v] at round steps (1, 2, 2.5 or 5
// times a power of ten); v comes from niceCeil, so one of 3..6 fits.
func ticks(v float64) int {
	for _, n := range []int{5, 4, 6, 3} {
		step := v / float64(n)
		m := step / math.Pow(10, math.Floor(math.Log10(step)))
		for _, r := range []float64{1, 2, 2.5, 5, 10} {
			if math.Abs(m-r) < 1e-9 {
				return n
			}
		}
	}
	return 5
}

func tick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":  func(s float64) string { return fmt.Sprintf("%.0f", 1000*s) },
	"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"f1":  func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"f3":  func(f float64) string { return fmt.Sprintf("%.3f", f) },
	"ok":  func(s Summary) int { return s.Requests - s.Errors },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.P.Title}}</title>
<style>
body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:90%}svg{display:block;margin:1em 0}
</style></head><body>
<h1>{{.P.Title}}</h1>
<p class="note">Generated {{.P.Generated.Format "2006-01-02 15:04:05 MST"}}</p>
<ul>{{range .P.Setup}}<li>{{.}}</li>{{end}}</ul>
<h2>Comparison</h2>
<table><tr><th>policy</th><th>ok / sent</th><th>TTFT p50 (ms)</th><th>p90</th><th>p99</th><th>req/s</th><th>output tok/s</th><th>prefix-cache hit rate</th><th>share of requests per server</th></tr>
{{range .P.Summaries}}<tr><td>{{.Policy}}</td><td>{{ok .}} / {{.Requests}}</td><td>{{ms .TTFTP50}}</td><td>{{ms .TTFTP90}}</td><td>{{ms .TTFTP99}}</td><td>{{f1 .RequestsPerSec}}</td><td>{{f1 .OutputTokensPerSec}}</td><td>{{pct .HitRate}}</td><td>{{range $i, $s := .Share}}{{if $i}} · {{end}}{{pct $s}}{{end}}</td></tr>
{{end}}</table>
<p class="note">TTFT is measured at the client: from sending the request to the first streamed event. The hit rate is the
servers' own count (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in tokens) over the run.</p>
<h2>Time to first token</h2>
{{.CDF}}
<p class="note">Further left is better. A cache-aware policy sends a request where its prefix is already cached, so the
server prefills only the new tokens.</p>
{{if .ITL}}<h2>Inter-token latency</h2>
{{.ITL}}
<p class="note">Each request's (latency − TTFT) over its tokens after the first, measured at the client. Further left is
better: a decode server that also prefills stalls its running sequences for every prefill it computes.</p>{{end}}
{{range .P.Tables}}<h2>{{.Title}}</h2>
<table><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{if .Note}}<p class="note">{{.Note}}</p>{{end}}
{{end}}{{range .Figures}}{{.SVG}}{{if .Note}}<p class="note">{{.Note}}</p>{{end}}
{{end}}<h2>Load per server over time</h2>
{{range .Queues}}{{.SVG}}{{end}}
<p class="note">Sampled from each server's /metrics (vllm:num_requests_waiting + vllm:num_requests_running).</p>
<h2>Network and GPUs</h2>
{{if .P.NoAgent}}<p class="note">No node agent ran: {{.P.NoAgent}}</p>{{end}}
{{range .P.Telemetry}}<h3>{{.Policy}}: node {{.Node}}</h3>
{{if .Err}}<p>No telemetry: {{.Err}}</p>{{else}}
{{if .GPUAvailable}}<table><tr><th>GPU</th><th>model</th><th>util</th><th>memory (GiB)</th><th>power (W)</th><th>temp (°C)</th><th>throttle</th><th>XID errors (last)</th><th>model servers</th></tr>
{{range .GPUs}}<tr><td>{{.Index}}</td><td>{{.Name}}</td><td>{{.UtilizationPercent}}%</td><td>{{f1 .MemoryUsedGiB}} / {{f1 .MemoryTotal}}</td><td>{{f1 .PowerWatts}} / {{f1 .PowerLimit}}</td><td>{{.TemperatureCelsius}}</td><td>{{range $i, $t := .Throttle}}{{if $i}}, {{end}}{{$t}}{{else}}—{{end}}</td><td>{{.XIDErrors}}{{if .XIDErrors}} ({{.LastXID}}){{end}}</td><td>{{range $i, $e := .Endpoints}}{{if $i}}, {{end}}{{$e}}{{end}}</td></tr>
{{end}}</table>{{else}}<p>GPU telemetry: none on this machine ({{.Reason}}).</p>{{end}}
{{if .Peers}}<table><tr><th>peer</th><th>class</th><th>flows</th><th>SRTT (ms)</th><th>min RTT (ms)</th><th>retransmits</th><th>MB</th><th>MB/s</th></tr>
{{range .Peers}}<tr><td>{{.Address}}</td><td>{{.Class}}</td><td>{{.Flows}}</td><td>{{f3 .SRTTMs}}</td><td>{{f3 .MinRTTMs}}</td><td>{{.Retransmits}}</td><td>{{f1 .MBytes}}</td><td>{{f1 .MBytesPerSec}}</td></tr>
{{end}}</table>{{else}}<p>Network: no peer measured (no KV moved between agents in this run).</p>{{end}}
{{end}}{{end}}
<p class="note">From the node agent's telemetry stream (kvgate.telemetry.v1), which the picker also subscribes to: NVML per
GPU, and per peer the agent's NIXL READ timings (class kv_nixl) and, with the eBPF tracker, TCP figures.</p>
</body></html>
`))
