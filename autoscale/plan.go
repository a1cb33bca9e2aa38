package autoscale

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/sim/engine"
)

// Variant is one way to serve the model: an accelerator type with its
// engine preset and price, as a WVA VariantAutoscaling names a Deployment
// with its variantCost.
type Variant struct {
	Name        string
	Accelerator string
	// Cost is the price of one replica per hour.
	Cost   float64
	Preset engine.Preset
	// Max bounds the replicas of this variant the planner considers.
	Max int
}

// SLOTarget is what a mix must deliver: at least Attainment of the requests
// meeting every objective set.
type SLOTarget struct {
	TTFT, TPOT time.Duration
	Attainment float64
}

// Mix is a replica count per variant, in the order of Planner.Variants.
type Mix []int

// Cost is the mix's price per hour.
func (m Mix) Cost(vs []Variant) float64 {
	c := 0.0
	for i, n := range m {
		c += float64(n) * vs[i].Cost
	}
	return c
}

// Replicas is the mix's total replica count.
func (m Mix) Replicas() int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Evaluation is how a mix served the offered load.
type Evaluation struct {
	Mix Mix
	// Met is the share of requests that met every objective; a failed
	// request meets none.
	Met float64
	// TTFTP90 and TPOTP90 are over the completed requests.
	TTFTP90, TPOTP90 time.Duration
}

// Planner finds the cheapest mix of variants meeting an SLO target at an
// offered load. Each candidate is judged on the simulated fleet (package
// cluster): the production picker routing the load to engines of each
// variant's preset on the virtual clock, so the routing policy's own
// latency model and load accounting take part as they would in the pool.
type Planner struct {
	Variants []Variant
	SLO      SLOTarget
	// Requests are the offered load, sorted by arrival.
	Requests []workload.Request
	// Routing is the picker configuration the pool runs.
	Routing cluster.Policy
	Seed    uint64
	// Model, when set, judges mixes on the picker's latency model fitted
	// to a calibration run (FitModel): the load replayed over the mix with
	// every latency predicted, no engine simulated.
	Model *latency.Model
	// Screen is the share of the load a mix must be estimated to carry
	// (from each variant's homogeneous need) to be simulated at all;
	// default 0.75.
	Screen float64

	evals map[string]Evaluation
}

// ErrInfeasible reports that no mix within the variants' bounds meets the
// target.
var ErrInfeasible = errors.New("autoscale: no mix of the variants meets the SLO target")

// MaxCandidates bounds the mixes a plan enumerates.
const MaxCandidates = 1 << 16

func (p *Planner) check() error {
	if len(p.Variants) == 0 {
		return errors.New("plan: no variants")
	}
	seen := map[string]bool{}
	model := p.Variants[0].Preset.Model.Name
	for _, v := range p.Variants {
		switch {
		case v.Name == "" || seen[v.Name]:
			return fmt.Errorf("plan: variant names must be unique and not empty, got %q", v.Name)
		case !(v.Cost > 0) || math.IsInf(v.Cost, 0):
			return fmt.Errorf("plan: variant %s: cost per hour must be positive, got %v", v.Name, v.Cost)
		case v.Max < 1 || v.Max > cluster.MaxReplicas:
			return fmt.Errorf("plan: variant %s: max replicas must be 1..%d, got %d", v.Name, cluster.MaxReplicas, v.Max)
		case v.Preset.Model.Name != model:
			return fmt.Errorf("plan: variant %s serves %s, variant %s %s: one model per plan", v.Name, v.Preset.Model.Name, p.Variants[0].Name, model)
		}
		seen[v.Name] = true
	}
	if p.SLO.TTFT <= 0 && p.SLO.TPOT <= 0 {
		return errors.New("plan: give a TTFT or a TPOT objective")
	}
	if !(p.SLO.Attainment > 0 && p.SLO.Attainment <= 1) {
		return fmt.Errorf("plan: attainment must be in (0, 1], got %v", p.SLO.Attainment)
	}
	if len(p.Requests) == 0 {
		return errors.New("plan: the offered load has no requests")
	}
	return nil
}

// Evaluate judges mix at the offered load (memoised): on the simulated
// fleet, or on the latency model when Model is set.
func (p *Planner) Evaluate(ctx context.Context, mix Mix) (Evaluation, error) {
	key := fmt.Sprint([]int(mix))
	if e, ok := p.evals[key]; ok {
		return e, nil
	}
	judge := p.simulate
	if p.Model != nil {
		judge = func(_ context.Context, m Mix) (Evaluation, error) { return p.replay(m) }
	}
	e, err := judge(ctx, mix)
	if err != nil {
		return Evaluation{}, err
	}
	if p.evals == nil {
		p.evals = map[string]Evaluation{}
	}
	p.evals[key] = e
	return e, nil
}

// simulate runs the offered load on mix on the simulated fleet.
func (p *Planner) simulate(ctx context.Context, mix Mix) (Evaluation, error) {
	var presets []engine.Preset
	for i, n := range mix {
		for range n {
			presets = append(presets, p.Variants[i].Preset)
		}
	}
	if len(presets) == 0 {
		return Evaluation{Mix: mix}, nil
	}
	res, err := cluster.Run(ctx, cluster.Options{
		Replicas: len(presets), Presets: presets, Seed: p.Seed,
		SLO: cluster.SLO{TTFT: p.SLO.TTFT, TPOT: p.SLO.TPOT, Fraction: 1},
	}, p.Routing, p.Requests)
	if err != nil {
		return Evaluation{}, fmt.Errorf("simulating %v: %w", mix, err)
	}
	e := Evaluation{Mix: slices.Clone(mix)}
	met := 0
	var ttft, tpot []float64
	for _, r := range res.Requests {
		if r.Err != "" {
			continue
		}
		ttft = append(ttft, r.TTFT.Seconds())
		if r.TPOT > 0 {
			tpot = append(tpot, r.TPOT.Seconds())
		}
		if (p.SLO.TTFT == 0 || r.TTFT <= p.SLO.TTFT) && (p.SLO.TPOT == 0 || r.TPOT <= p.SLO.TPOT) {
			met++
		}
	}
	e.Met = float64(met) / float64(len(res.Requests))
	e.TTFTP90 = time.Duration(quantile(ttft, 0.9) * float64(time.Second))
	e.TPOTP90 = time.Duration(quantile(tpot, 0.9) * float64(time.Second))
	return e, nil
}

// Meets reports whether an evaluation meets the target.
func (p *Planner) Meets(e Evaluation) bool { return e.Met >= p.SLO.Attainment }

// Plan is a planner's answer.
type Plan struct {
	Best Evaluation
	// Alone is each variant's smallest homogeneous fleet meeting the
	// target (0 when none within its Max does).
	Alone []int
	// Simulated counts the mixes judged on the simulated fleet.
	Simulated int
}

// Plan finds the cheapest mix meeting the target. First each variant's
// smallest homogeneous fleet N_v that meets it is found by bisection; a
// mix is then estimated to carry Σ n_v/N_v of the load. Mixes estimated to
// carry at least Screen of it are simulated cheapest first (fewer replicas
// breaking ties), and the first that meets the target is the plan: every
// cheaper mix was either simulated and failed or estimated far short.
func (p *Planner) Plan(ctx context.Context) (*Plan, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	screen := p.Screen
	if screen == 0 {
		screen = 0.75
	}
	out := &Plan{Alone: make([]int, len(p.Variants))}
	for i, v := range p.Variants {
		n, err := p.alone(ctx, i, v.Max)
		if err != nil {
			return nil, err
		}
		out.Alone[i] = n
	}
	var cands []Mix
	bound := make([]int, len(p.Variants))
	feasible := false
	for i, v := range p.Variants {
		bound[i] = v.Max
		if out.Alone[i] > 0 {
			bound[i] = out.Alone[i]
			feasible = true
		}
	}
	if !feasible {
		// No variant alone meets it; a mix of full fleets may.
		all := Mix(slices.Clone(bound))
		e, err := p.Evaluate(ctx, all)
		if err != nil {
			return nil, err
		}
		if !p.Meets(e) {
			return nil, fmt.Errorf("%w: every variant at its maximum meets %.1f%%, want %.1f%%", ErrInfeasible, 100*e.Met, 100*p.SLO.Attainment)
		}
	}
	count := 1
	for _, b := range bound {
		count *= b + 1
		if count > MaxCandidates {
			return nil, fmt.Errorf("plan: more than %d mixes to consider; lower the variants' max", MaxCandidates)
		}
	}
	estimate := func(m Mix) float64 {
		c := 0.0
		for i, n := range m {
			if out.Alone[i] > 0 {
				c += float64(n) / float64(out.Alone[i])
			} else {
				c += float64(n) / float64(bound[i]) * 0.5 // unknown: a full fleet falls short alone
			}
		}
		return c
	}
	m := make(Mix, len(p.Variants))
	for {
		if m.Replicas() > 0 && estimate(m) >= screen {
			cands = append(cands, slices.Clone(m))
		}
		i := 0
		for i < len(m) && m[i] == bound[i] {
			m[i] = 0
			i++
		}
		if i == len(m) {
			break
		}
		m[i]++
	}
	slices.SortStableFunc(cands, func(a, b Mix) int {
		return cmp.Or(cmp.Compare(a.Cost(p.Variants), b.Cost(p.Variants)), cmp.Compare(a.Replicas(), b.Replicas()))
	})
	for _, c := range cands {
		e, err := p.Evaluate(ctx, c)
		if err != nil {
			return nil, err
		}
		if p.Meets(e) {
			out.Best = e
			out.Simulated = len(p.evals)
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w within the variants' bounds", ErrInfeasible)
}

// alone is the smallest homogeneous fleet of variant i meeting the target,
// 0 when max replicas do not.
func (p *Planner) alone(ctx context.Context, i, maxN int) (int, error) {
	mix := func(n int) Mix {
		m := make(Mix, len(p.Variants))
		m[i] = n
		return m
	}
	e, err := p.Evaluate(ctx, mix(maxN))
	if err != nil || !p.Meets(e) {
		return 0, err
	}
	lo, hi := 0, maxN // lo fails (or is empty), hi meets
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		e, err := p.Evaluate(ctx, mix(mid))
		if err != nil {
			return 0, err
		}
		if p.Meets(e) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}
