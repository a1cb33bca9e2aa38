package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/demo/report"
	"github.com/kvgate/kvgate/demo/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sidecar"
)

// PDSummary adds inter-token latency to a run's summary.
type PDSummary struct {
	report.Summary
	// ITL percentiles in seconds: each request's (latency − TTFT) over its
	// tokens after the first.
	ITLP50 float64 `json:"itl_p50_s"`
	ITLP99 float64 `json:"itl_p99_s"`
}

func summarizePD(r report.Run) PDSummary {
	s := PDSummary{Summary: report.Summarize(r)}
	var itls []float64
	for _, res := range r.Results {
		if v, ok := report.ITL(res); ok && res.OK() {
			itls = append(itls, v)
		}
	}
	slices.Sort(itls)
	if n := len(itls); n > 0 {
		s.ITLP50, s.ITLP99 = itls[n/2], itls[min(n-1, n*99/100)]
	}
	return s
}

// runPD is `kvgate up --pd xPyD`: the same workload through a collocated
// fleet of x+y servers (approximate prefix routing) and through the P/D
// fleet, then the comparison and the P/D data plane's report.
func runPD(ctx context.Context, o Options, reqs []workload.Request, stdout io.Writer, tty bool) error {
	shape, err := ParsePDShape(o.PD)
	if err != nil {
		return err
	}
	images := 0
	if o.EPD {
		shape.Encode, images = 1, o.EPDImages
	}
	n := shape.Encode + shape.Prefill + shape.Decode
	fmt.Fprintf(stdout, "kvgate up --pd %s: %d requests through a collocated fleet of %d and a %s fleet (decider %s)\noutput: %s\n",
		shape, len(reqs), n, shape, o.PDDecider, o.Out)
	base := StackConfig{Bin: o.Bin, Wasm: o.Wasm, TokenizerDir: o.TokenizerDir, TimeScale: o.TimeScale, NumGPUBlocks: o.NumGPUBlocks,
		HashSeed: kvhash.DefaultSeed, GatewayArgs: o.GatewayArgs, Ready: 60 * time.Second}

	colName := fmt.Sprintf("collocated-%d", n)
	col := base
	col.Replicas, col.Policy, col.LogDir = n, config.PolicyApprox, filepath.Join(o.Out, "logs", colName)
	col.Progress = func(s string) { fmt.Fprintf(stdout, "[%s]   %s\n", colName, s) }
	fmt.Fprintf(stdout, "\n[%s] starting %d sims, epp and gateway...\n", colName, n)
	cstack, err := StartStack(ctx, col)
	if err != nil {
		return fmt.Errorf("%s fleet: %w", colName, err)
	}
	colRun, err := replay(ctx, cstack, colName, reqs, images, stdout, tty)
	cstack.Close()
	if err != nil {
		return err
	}

	pdName := shape.String()
	pc := PDConfig{StackConfig: base, Shape: shape, Decider: o.PDDecider, NonCachedTokens: o.PDNonCachedTokens, KVBytesPerToken: o.KVBytesPerToken,
		KVConnector: o.KVConnector}
	pc.LogDir = filepath.Join(o.Out, "logs", pdName)
	pc.SimArgs = []string{"--kv-load-failure-policy", o.PDLoadFailurePolicy}
	pc.Progress = func(s string) { fmt.Fprintf(stdout, "[%s]   %s\n", pdName, s) }
	fmt.Fprintf(stdout, "\n[%s] starting %d node agents, %d encode + %d prefill + %d decode sims, %d sidecars, epp and gateway...\n",
		pdName, pc.nodeAgents(), shape.Encode, shape.Prefill, shape.Decode, shape.Decode)
	pstack, err := StartPDStack(ctx, pc)
	if err != nil {
		return fmt.Errorf("%s fleet: %w", pdName, err)
	}
	pdRun, err := replay(ctx, pstack.Stack, pdName, reqs, images, stdout, tty)
	if err != nil {
		pstack.Close()
		return err
	}
	pr, err := pstack.Collect(ctx)
	var tel []report.Telemetry
	for _, a := range pstack.Agents {
		tel = append(tel, agentTelemetry(ctx, pdName+" "+a.Name, a.Addr))
	}
	pstack.Close()
	if err != nil {
		return fmt.Errorf("%s: reading the data plane's counters: %w", pdName, err)
	}

	sums := []PDSummary{summarizePD(colRun), summarizePD(pdRun)}
	blockBytes := pc.KVBytesPerToken * kvhash.DefaultBlockSize
	fmt.Fprintln(stdout)
	if err := writePDTable(stdout, sums, pr, blockBytes, o.KVConnector); err != nil {
		return err
	}
	runs := []report.Run{colRun, pdRun}
	if err := writeJSON(filepath.Join(o.Out, "results.json"), map[string]any{"options": o, "summaries": sums, "pd": pr, "runs": runs, "telemetry": tel}); err != nil {
		return err
	}
	page := pdPage(o, shape, runs, sums, pr, blockBytes)
	page.Telemetry = tel
	if err := writeHTML(filepath.Join(o.Out, "report.html"), page); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreport:  %s", filepath.Join(o.Out, "report.html"))
	fmt.Fprintf(stdout, "\nresults: %s\nlogs:    %s\n", filepath.Join(o.Out, "results.json"), filepath.Join(o.Out, "logs"))
	for _, s := range sums {
		if s.Errors > 0 {
			return fmt.Errorf("%s: %d of %d requests failed (see results.json)", s.Policy, s.Errors, s.Requests)
		}
	}
	pulls, _, bad := pr.TotalPulls()
	switch {
	case bad > 0:
		return fmt.Errorf("%s: %.0f pulled KV blocks had wrong bytes", pdName, bad)
	case pulls == 0 && o.PDDecider == DeciderAlways:
		return fmt.Errorf("%s: no KV transfer happened", pdName)
	}
	return nil
}

// pdPage is the HTML report of `kvgate up --pd`: the two fleets compared
// (TTFT and ITL), the P/D pairs, what each decode server's transfers moved
// and the distribution of their sizes.
func pdPage(o Options, shape PDShape, runs []report.Run, sums []PDSummary, pr PDReport, blockBytes int) report.Page {
	n := shape.Encode + shape.Prefill + shape.Decode
	setup := []string{
		fmt.Sprintf("the same %d requests from the Mooncake trace (arrivals compressed into %s, output capped at %d tokens) through a collocated fleet of %d simulated vLLM servers (approximate prefix routing) and a %s fleet of the same size",
			o.Requests, o.Workload.Duration, o.Workload.MaxOutputTokens, n, shape),
		fmt.Sprintf("%s: %d prefill and %d decode sims (preset qwen3-0.6b-h100, time scale %g, %d KV blocks of %d tokens), one kvgate sidecar per decode sim (--kv-connector %s), KV %s (%d bytes per block, every block's bytes verified), the picker with disagg-profile-handler and decider %q",
			shape, shape.Prefill, shape.Decode, o.TimeScale, o.NumGPUBlocks, kvhash.DefaultBlockSize, cmp.Or(o.KVConnector, sidecar.ConnectorNIXLV2), kvPath(o.KVConnector), blockBytes, o.PDDecider),
	}
	if shape.Encode > 0 {
		setup = append(setup, fmt.Sprintf("E/P/D: %d encode sim; chat requests each with one of %d images", shape.Encode, o.EPDImages))
	}
	latencies := report.Table{Title: "TTFT and ITL", Header: []string{"fleet", "ok / sent", "TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)", "ITL p99 (ms)", "req/s", "output tok/s"},
		Note: "ITL is each request's (latency − TTFT) over its tokens after the first."}
	for _, s := range sums {
		latencies.Rows = append(latencies.Rows, []string{s.Policy, fmt.Sprintf("%d / %d", s.Requests-s.Errors, s.Requests),
			fmt.Sprintf("%.0f", 1000*s.TTFTP50), fmt.Sprintf("%.0f", 1000*s.TTFTP99), fmt.Sprintf("%.1f", 1000*s.ITLP50), fmt.Sprintf("%.1f", 1000*s.ITLP99),
			fmt.Sprintf("%.1f", s.RequestsPerSec), fmt.Sprintf("%.0f", s.OutputTokensPerSec)})
	}
	pairs := report.Table{Title: "P/D pairs", Header: []string{"prefill server", "decode server", "requests"},
		Note: "From each sidecar's kvgate_sidecar_pd_requests_total: the requests it sent to that prefill server before decoding them."}
	for _, p := range pr.Pairs {
		pairs.Rows = append(pairs.Rows, []string{p.Prefill, p.Decode, fmt.Sprintf("%.0f", p.Requests)})
	}
	transfers := report.Table{Title: "KV transfers", Header: []string{"decode server", "transfers", "bytes", "bytes / transfer", "blocks / transfer", "failed", "verify failures"},
		Note: fmt.Sprintf("The decode sims' own counters of the KV they loaded, %s (%d bytes per %d-token block).", kvPath(o.KVConnector), blockBytes, kvhash.DefaultBlockSize)}
	sizes := report.Figure{Title: "Bytes per transfer, cumulative distribution", XLabel: "bytes moved by one transfer (MB)", YLabel: "fraction of transfers", YMax: 1,
		Note: "From each decode sim's vllm:nixl_bytes_transferred histogram (at its bucket bounds)."}
	for _, t := range pr.Transfers {
		blocks := 0.0
		if blockBytes > 0 {
			blocks = t.BytesPerPull / float64(blockBytes)
		}
		transfers.Rows = append(transfers.Rows, []string{t.Decode, fmt.Sprintf("%.0f", t.Pulls), fmt.Sprintf("%.0f", t.Bytes), fmt.Sprintf("%.0f", t.BytesPerPull),
			fmt.Sprintf("%.1f", blocks), fmt.Sprintf("%.0f", t.Failures), fmt.Sprintf("%.0f", t.VerifyFailures)})
		if c, ok := sizeCurve(t); ok {
			sizes.Curves = append(sizes.Curves, c)
		}
	}
	p := report.Page{Title: fmt.Sprintf("kvgate up --pd %s: P/D disaggregation against a collocated fleet", shape), Generated: time.Now(),
		Setup: setup, Runs: runs, ITL: true, Tables: []report.Table{latencies, pairs, transfers}}
	for _, s := range sums {
		p.Summaries = append(p.Summaries, s.Summary)
	}
	if len(sizes.Curves) > 0 {
		p.Figures = []report.Figure{sizes}
	}
	return p
}

// sizeCurve is a decode server's transfer sizes as a cumulative curve
// from its histogram; false when it made no transfer.
func sizeCurve(t PDTransfers) (report.Curve, bool) {
	type bucket struct{ le, count float64 }
	var bs []bucket
	total := 0.0
	for k, v := range t.Sizes {
		le, err := strconv.ParseFloat(k, 64)
		if err != nil {
			continue
		}
		total = max(total, v)
		if !math.IsInf(le, 1) {
			bs = append(bs, bucket{le, v})
		}
	}
	if total == 0 {
		return report.Curve{}, false
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	// From the last empty bucket to the first that holds every transfer:
	// the buckets beyond would stretch the axis to the histogram's top.
	first, last := 0, len(bs)-1
	for i, b := range bs {
		if b.count == 0 {
			first = i
		}
		if b.count >= total {
			last = i
			break
		}
	}
	c := report.Curve{Name: t.Decode}
	for _, b := range bs[first : last+1] {
		c.Points = append(c.Points, [2]float64{b.le / 1e6, b.count / total})
	}
	return c, true
}

func writePDTable(w io.Writer, sums []PDSummary, pr PDReport, blockBytes int, connector string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fleet\tok/sent\tTTFT p50\tp99\tITL p50\tp99\treq/s\tout tok/s\t")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%d/%d\t%.0f ms\t%.0f ms\t%.1f ms\t%.1f ms\t%.1f\t%.0f\t\n", s.Policy, s.Requests-s.Errors, s.Requests,
			1000*s.TTFTP50, 1000*s.TTFTP99, 1000*s.ITLP50, 1000*s.ITLP99, s.RequestsPerSec, s.OutputTokensPerSec)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nP/D pairs (requests the prefill server handed to the decode pod):")
	for _, p := range pr.Pairs {
		fmt.Fprintf(w, "  %s -> %s: %.0f\n", p.Prefill, p.Decode, p.Requests)
	}
	fmt.Fprintf(w, "\nKV transfers (%s, every block's bytes verified; %d bytes per block):\n", kvPath(connector), blockBytes)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "decode\ttransfers\tbytes\tbytes/transfer\tblocks/transfer\tfailed\tverify failures\t")
	for _, t := range pr.Transfers {
		blocks := 0.0
		if blockBytes > 0 {
			blocks = t.BytesPerPull / float64(blockBytes)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t\n", t.Decode, t.Pulls, t.Bytes, t.BytesPerPull, blocks, t.Failures, t.VerifyFailures)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(pr.Encoders) > 0 {
		fmt.Fprintln(w, "\nEncode stage (outputs handed to the prefill servers as ec_transfer_params):")
		for _, e := range pr.Encoders {
			fmt.Fprintf(w, "  %s: %.0f encoder passes, %.0f cache hits\n", e.Encode, e.Runs, e.CacheHits)
		}
		fmt.Fprintf(w, "  prefill servers used %.0f encoder outputs from the encode stage\n", pr.RemoteEncoded)
	}
	return nil
}
