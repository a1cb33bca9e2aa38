package benchmarks

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
)

// ClassSummary is what one traffic class (the requests naming one
// InferenceObjective) got.
type ClassSummary struct {
	Objective string  `json:"objective"`
	Priority  int     `json:"priority"`
	Requests  int     `json:"requests"`
	Served    int     `json:"served"`
	TTFTP50   float64 `json:"ttft_p50_s"`
	TTFTP90   float64 `json:"ttft_p90_s"`
	// SLOMet is the share of the class's requests (served or not) whose
	// TTFT met the run's TTFT objective; -1 without one.
	SLOMet float64 `json:"slo_met"`
	// ThroughputOutputTokS is the output tokens of the class's requests
	// that completed within the arrival window (first to last arrival of
	// the run), per second of it: what the class got while the traffic
	// was offered, not while a queue drained afterwards.
	ThroughputOutputTokS float64 `json:"throughput_output_tok_s"`
	// Queue time in flow control of the requests dispatched.
	QueueP50 float64 `json:"queue_p50_s"`
	QueueP90 float64 `json:"queue_p90_s"`
	// Rejected at enqueue (capacity, no endpoints), Expired (TTL),
	// Cancelled (client), Evicted (revoked in flight).
	Rejected  int `json:"rejected"`
	Expired   int `json:"expired"`
	Cancelled int `json:"cancelled"`
	Evicted   int `json:"evicted"`
	// MaxLeftLate is the longest a request stayed queued past its TTL or
	// its client's deadline, in seconds.
	MaxLeftLate float64 `json:"max_left_late_s"`
	// Mean and Tail break the served requests' TTFT down, averaged over
	// all of them and over those at or above the class's p90 TTFT.
	Mean TTFTParts `json:"ttft_breakdown_mean"`
	Tail TTFTParts `json:"ttft_breakdown_tail"`
	// Preempted counts served requests their engine preempted at least once.
	Preempted int `json:"preempted"`
	// PrefixHit is the share of the served requests' prompt tokens their
	// engine found cached: batch's KV can push the class's prefixes out,
	// which lengthens its prefills without sharing a step with batch.
	PrefixHit float64 `json:"prefix_hit_ratio"`
}

// TTFTParts is an average cluster.TTFTBreakdown, in seconds: Queue +
// EngineWait + Prefill = TTFT; InFlight is part of EngineWait, and the
// inflations are parts of Prefill.
type TTFTParts struct {
	Requests         int     `json:"requests"`
	TTFT             float64 `json:"ttft_s"`
	Queue            float64 `json:"queue_s"`
	EngineWait       float64 `json:"engine_wait_s"`
	InFlight         float64 `json:"in_flight_s"`
	InFlightBatch    float64 `json:"in_flight_inflation_s"`
	Prefill          float64 `json:"prefill_s"`
	DecodeInflation  float64 `json:"decode_inflation_s"`
	PrefillInflation float64 `json:"prefill_inflation_s"`
}

func (p *TTFTParts) add(r *cluster.RequestResult) {
	p.Requests++
	p.TTFT += r.TTFT.Seconds()
	p.Queue += r.Queued.Seconds()
	b := r.Breakdown
	p.EngineWait += b.EngineWait.Seconds()
	p.InFlight += b.InFlight.Seconds()
	p.InFlightBatch += b.InFlightInflation.Seconds()
	p.Prefill += b.Prefill.Seconds()
	p.DecodeInflation += b.DecodeInflation.Seconds()
	p.PrefillInflation += b.PrefillInflation.Seconds()
}

func (p *TTFTParts) average() {
	if p.Requests == 0 {
		return
	}
	n := float64(p.Requests)
	p.TTFT, p.Queue, p.EngineWait, p.InFlight, p.InFlightBatch = p.TTFT/n, p.Queue/n, p.EngineWait/n, p.InFlight/n, p.InFlightBatch/n
	p.Prefill, p.DecodeInflation, p.PrefillInflation = p.Prefill/n, p.DecodeInflation/n, p.PrefillInflation/n
}

// summarizeClasses is nil when no request named an objective.
func summarizeClasses(res *cluster.Result) []ClassSummary {
	type acc struct {
		c           ClassSummary
		ttft, queue []float64
		served      []*cluster.RequestResult
		out         int64
		prompt      int64
		cached      int64
		met         int
	}
	by := map[string]*acc{}
	var order []string
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	for i := range res.Requests {
		first, last = min(first, res.Requests[i].Arrival), max(last, res.Requests[i].Arrival)
	}
	span := (last - first).Seconds()
	for i := range res.Requests {
		r := &res.Requests[i]
		if r.Objective == "" {
			continue
		}
		a := by[r.Objective]
		if a == nil {
			a = &acc{c: ClassSummary{Objective: r.Objective, Priority: r.Priority}}
			by[r.Objective] = a
			order = append(order, r.Objective)
		}
		a.c.Requests++
		switch r.Outcome {
		case "":
		case flowcontrol.RejectedCapacity.String(), flowcontrol.RejectedNoEndpoints.String(), flowcontrol.RejectedOther.String():
			a.c.Rejected++
		case flowcontrol.EvictedTTL.String(), flowcontrol.EvictedNoEndpoints.String():
			a.c.Expired++
		case flowcontrol.EvictedContextCancelled.String():
			a.c.Cancelled++
		default:
			a.c.Evicted++
		}
		a.c.MaxLeftLate = max(a.c.MaxLeftLate, r.LeftLate.Seconds())
		if r.Err != "" {
			continue
		}
		a.c.Served++
		a.served = append(a.served, r)
		a.prompt += int64(r.PromptTokens)
		a.cached += int64(r.CachedTokens)
		a.ttft = append(a.ttft, r.TTFT.Seconds())
		a.queue = append(a.queue, r.Queued.Seconds())
		if r.Arrival+r.E2E <= last {
			a.out += int64(r.OutputTokens)
		}
		if res.SLO.TTFT > 0 && r.TTFT <= res.SLO.TTFT {
			a.met++
		}
	}
	slices.SortFunc(order, func(x, y string) int { return by[y].c.Priority - by[x].c.Priority })
	var out []ClassSummary
	for _, name := range order {
		a := by[name]
		slices.Sort(a.ttft)
		slices.Sort(a.queue)
		a.c.TTFTP50, a.c.TTFTP90 = pct(a.ttft, 50), pct(a.ttft, 90)
		for _, r := range a.served {
			a.c.Mean.add(r)
			if r.TTFT.Seconds() >= a.c.TTFTP90 {
				a.c.Tail.add(r)
			}
			if r.Breakdown.Preemptions > 0 {
				a.c.Preempted++
			}
		}
		a.c.Mean.average()
		a.c.Tail.average()
		a.c.QueueP50, a.c.QueueP90 = pct(a.queue, 50), pct(a.queue, 90)
		a.c.SLOMet = -1
		if res.SLO.TTFT > 0 {
			a.c.SLOMet = float64(a.met) / float64(a.c.Requests)
		}
		if a.prompt > 0 {
			a.c.PrefixHit = float64(a.cached) / float64(a.prompt)
		}
		if span > 0 {
			a.c.ThroughputOutputTokS = float64(a.out) / span
		}
		out = append(out, a.c)
	}
	return out
}

// classTable writes the per-class breakdown the results have data for.
func classTable(b *strings.Builder, r *Results) {
	any := false
	for _, s := range r.Policies {
		any = any || len(s.Classes) > 0
	}
	if !any {
		return
	}
	b.WriteString("\nBy traffic class (objective):\n\n| policy | qps scale | class | priority | requests | served | TTFT p50 s | TTFT p90 s | TTFT SLO met | output tok/s | queue p50 s | queue p90 s | rejected | expired | cancelled | evicted | max late ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Policies {
		for _, c := range s.Classes {
			met := "–"
			if c.SLOMet >= 0 {
				met = fmt.Sprintf("%.3f", c.SLOMet)
			}
			fmt.Fprintf(b, "| %s | %g | %s | %d | %d | %d | %.3f | %.3f | %s | %.0f | %.3f | %.3f | %d | %d | %d | %d | %.0f |\n",
				s.Name, s.QPSScale, c.Objective, c.Priority, c.Requests, c.Served, c.TTFTP50, c.TTFTP90, met,
				c.ThroughputOutputTokS, c.QueueP50, c.QueueP90, c.Rejected, c.Expired, c.Cancelled, c.Evicted,
				c.MaxLeftLate*1000)
		}
	}
	b.WriteString("\nWhere TTFT went (ms; mean over the served requests, and over those at or above the class's p90): picker queue + engine wait (of it: the step in flight at receipt, and what sheddable requests added to that step) + prefill steps (of them: what sheddable decodes and prefills in the same steps added):\n\n| policy | qps scale | class | over | TTFT | queue | engine wait | in flight | +batch in flight | prefill | +batch decode | +batch prefill | preempted | prefix hit |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Policies {
		for _, c := range s.Classes {
			for _, p := range []struct {
				over string
				t    TTFTParts
			}{{"all", c.Mean}, {"≥ p90", c.Tail}} {
				ms := func(v float64) string { return fmt.Sprintf("%.1f", v*1000) }
				fmt.Fprintf(b, "| %s | %g | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %.3f |\n",
					s.Name, s.QPSScale, c.Objective, p.over, ms(p.t.TTFT), ms(p.t.Queue), ms(p.t.EngineWait),
					ms(p.t.InFlight), ms(p.t.InFlightBatch), ms(p.t.Prefill), ms(p.t.DecodeInflation), ms(p.t.PrefillInflation), c.Preempted, c.PrefixHit)
			}
		}
	}
}
