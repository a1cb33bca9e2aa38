package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/demo/report"
	"github.com/kvgate/kvgate/demo/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/kvhash"
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
		if res.OK() && res.CompletionTokens > 1 {
			itls = append(itls, (res.Latency-res.TTFT).Seconds()/float64(res.CompletionTokens-1))
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
	pc := PDConfig{StackConfig: base, Shape: shape, Decider: o.PDDecider, NonCachedTokens: o.PDNonCachedTokens, KVBytesPerToken: o.KVBytesPerToken}
	pc.LogDir = filepath.Join(o.Out, "logs", pdName)
	pc.SimArgs = []string{"--kv-load-failure-policy", o.PDLoadFailurePolicy}
	pc.Progress = func(s string) { fmt.Fprintf(stdout, "[%s]   %s\n", pdName, s) }
	fmt.Fprintf(stdout, "\n[%s] starting %d node agents, %d encode + %d prefill + %d decode sims, %d sidecars, epp and gateway...\n",
		pdName, shape.Prefill+shape.Decode, shape.Encode, shape.Prefill, shape.Decode, shape.Decode)
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
	pstack.Close()
	if err != nil {
		return fmt.Errorf("%s: reading the data plane's counters: %w", pdName, err)
	}

	sums := []PDSummary{summarizePD(colRun), summarizePD(pdRun)}
	fmt.Fprintln(stdout)
	if err := writePDTable(stdout, sums, pr, pc.KVBytesPerToken*kvhash.DefaultBlockSize); err != nil {
		return err
	}
	js, err := json.MarshalIndent(map[string]any{"options": o, "summaries": sums, "pd": pr, "runs": []report.Run{colRun, pdRun}}, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "results.json"), js, 0o644); err != nil {
		return fmt.Errorf("results.json: %w", err)
	}
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

func writePDTable(w io.Writer, sums []PDSummary, pr PDReport, blockBytes int) error {
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
	fmt.Fprintf(w, "\nKV transfers (NIXL READ through the node agents, every block's bytes verified; %d bytes per block):\n", blockBytes)
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
