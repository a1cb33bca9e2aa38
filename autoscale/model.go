package autoscale

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/sim/engine"
)

// The planner on the picker's latency model.
//
// The simulated fleet answers "does this mix meet the SLOs" by running
// engines. The picker already holds a cheaper answer: its online latency
// model (extproc/latency) predicts a request's TTFT and TPOT on an endpoint
// from the endpoint's live load account. Planning on that model means
// fitting it, as the picker does, from one run's observations, and then
// replaying the offered load over a candidate mix with the load account
// kept as the picker keeps it and every latency predicted by the model.
// Where the model is right, both plans agree; where they differ, it shows
// what the picker's model misjudges about the fleet (the planner test
// reports both).

// Observation is one latency sample as the picker's model learns it: the
// features the replica's load account held, the latency measured, and the
// fit it belongs to.
type Observation struct {
	Key      string
	TPOT     bool // a TPOT sample; else TTFT
	Features latency.Features
	Actual   time.Duration
}

// Apply teaches the sample to m.
func (o Observation) Apply(m *latency.Model) {
	if o.TPOT {
		m.ObserveTPOT(o.Key, o.Features, o.Actual)
	} else {
		m.ObserveTTFT(o.Key, o.Features, o.Actual)
	}
}

// Observations are a run's served requests as the picker's model samples
// them online: each request's TTFT with the features its replica's load
// account held when it was routed (the prompt work of requests routed
// there and awaiting a first token, and the requests decoding there), and
// its TPOT with the decode batch it joined at its first token. The load
// account is rebuilt from the requests' own timelines. Samples are keyed
// by the replica's preset: replicas of one preset share a fit, as the
// planner's replay predicts them. Failed and unrouted requests give none
// (the picker learns from successful streams only).
func Observations(reqs []cluster.RequestResult) []Observation {
	byReplica := map[int][]*cluster.RequestResult{}
	var order []int
	for i := range reqs {
		r := &reqs[i]
		if r.Err != "" || r.Replica < 0 || r.TTFT <= 0 {
			continue
		}
		if _, ok := byReplica[r.Replica]; !ok {
			order = append(order, r.Replica)
		}
		byReplica[r.Replica] = append(byReplica[r.Replica], r)
	}
	var out []Observation
	for _, k := range order {
		rs := byReplica[k]
		slices.SortStableFunc(rs, func(a, b *cluster.RequestResult) int { return cmp.Compare(a.Arrival, b.Arrival) })
		for i, r := range rs {
			var acct account
			for _, o := range rs[:i] {
				acct.add(o, r.Arrival)
			}
			out = append(out, Observation{Key: r.Preset, Features: acct.features(r.PromptTokens, r.CachedTokens), Actual: r.TTFT})
			if r.TPOT <= 0 {
				continue
			}
			first := r.Arrival + r.TTFT
			var at account
			for _, o := range rs {
				if o != r {
					at.add(o, first)
				}
			}
			at.joinDecode(r.PromptTokens, r.OutputTokens)
			out = append(out, Observation{Key: r.Preset, TPOT: true, Features: at.features(r.PromptTokens, r.PromptTokens), Actual: r.TPOT})
		}
	}
	return out
}

// account is one replica's load as the picker counts it at an instant.
type account struct {
	prefillTokens, prefillAttention float64
	decodes, decodeTokens           float64
}

// add counts request o, if it is in flight at t: in prefill from its
// arrival to its first token, decoding from then to its end.
func (a *account) add(o *cluster.RequestResult, t time.Duration) {
	switch first, end := o.Arrival+o.TTFT, o.Arrival+o.E2E; {
	case o.Arrival <= t && t < first:
		uncached := int64(max(0, o.PromptTokens-o.CachedTokens))
		a.prefillTokens += float64(uncached)
		a.prefillAttention += float64(endpoints.AttentionPairs(int64(o.CachedTokens), uncached))
	case first <= t && t < end:
		a.decodes++
		a.decodeTokens += float64(o.PromptTokens + o.OutputTokens)
	}
}

// joinDecode counts a request of prompt and output tokens as decoding.
func (a *account) joinDecode(prompt, output int) {
	a.decodes++
	a.decodeTokens += float64(prompt + output)
}

// features are the latency model's for a prompt of prompt tokens, cached
// of them held, arriving on this load.
func (a *account) features(prompt, cached int) latency.Features {
	uncached := int64(max(0, prompt-cached))
	return latency.Features{
		Prefill:      float64(uncached),
		Backlog:      a.prefillTokens,
		Attention:    float64(endpoints.AttentionPairs(int64(cached), uncached)) + a.prefillAttention,
		Decodes:      a.decodes,
		DecodeTokens: a.decodeTokens,
	}
}

// Calibration is the run the planner's latency model is fitted from: one
// replica of each variant's preset (the picker learns every replica's own
// speed, so one each suffices), serving the offered load's requests with
// the arrival rate ramped linearly from zero to the offered rate over the
// offered duration, so that the replicas pass from idle through their
// capacity into overload and the model sees every regime it will be asked
// about.
func (p *Planner) Calibration() []workload.Request {
	if len(p.Requests) == 0 {
		return nil
	}
	d := p.Requests[len(p.Requests)-1].Arrival
	var out []workload.Request
	for _, r := range p.Requests {
		if r.Arrival > d/2 {
			break
		}
		// Cumulative arrivals R·t become R·t'²/(2d): the rate R·t'/d.
		r.Arrival = time.Duration(math.Sqrt(2 * float64(d) * float64(r.Arrival)))
		out = append(out, r)
	}
	return out
}

// FitModel fits the picker's latency model to the Observations of the
// offered load served by the current fleet (a live fleet's observations,
// here simulated), or, when current is empty, of the Calibration ramp on
// one replica of each variant's preset. It fits without forgetting: every
// sample counts alike, where the picker's default forgets old ones to
// follow a changing server. The result can be set as Planner.Model.
func (p *Planner) FitModel(ctx context.Context, current Mix) (*latency.Model, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	var presets []engine.Preset
	reqs := p.Requests
	if current.Replicas() == 0 {
		for _, v := range p.Variants {
			if !slices.ContainsFunc(presets, func(q engine.Preset) bool { return q.Name == v.Preset.Name }) {
				presets = append(presets, v.Preset)
			}
		}
		reqs = p.Calibration()
	} else {
		if len(current) != len(p.Variants) {
			return nil, fmt.Errorf("current fleet %v: want a count per variant (%d)", current, len(p.Variants))
		}
		for i, n := range current {
			for range n {
				presets = append(presets, p.Variants[i].Preset)
			}
		}
	}
	res, err := cluster.Run(ctx, cluster.Options{Replicas: len(presets), Presets: presets, Seed: p.Seed}, p.Routing, reqs)
	if err != nil {
		return nil, fmt.Errorf("calibration: %w", err)
	}
	m := latency.New(latency.Config{Forgetting: 1, Quantile: fitQuantile})
	// Without forgetting the coefficients do not depend on the samples'
	// order, but the residual quantiles follow the latest ones: shuffled,
	// they stand for the whole calibration, and a second pass measures
	// them against the settled fit rather than the first samples' guesses.
	obs := Observations(res.Requests)
	rng := rand.New(rand.NewPCG(p.Seed, 0x6d0de1))
	rng.Shuffle(len(obs), func(i, j int) { obs[i], obs[j] = obs[j], obs[i] })
	for range 2 {
		for _, o := range obs {
			o.Apply(m)
		}
	}
	for _, v := range p.Variants {
		if !slices.ContainsFunc(m.Fits(), func(f latency.Fit) bool {
			return f.Address == v.Preset.Name && f.TTFTSamples >= latency.DefaultMinSamples
		}) {
			return nil, fmt.Errorf("calibration: no replica of preset %s served enough requests to fit it (%d requests offered)", v.Preset.Name, len(reqs))
		}
	}
	return m, nil
}

// fitQuantile is the high quantile the planner's model predicts, and
// zQuantile the standard normal's quantile there: together they give the
// spread of the model's log-normal residuals.
const (
	fitQuantile = 0.9
	zQuantile   = 1.2815515655446004
)

// ErrNoTPOT reports a model that cannot predict TPOT (no calibration
// stream had two output tokens) asked to judge a TPOT objective.
var ErrNoTPOT = errors.New("autoscale: the latency model has no TPOT fit")

// replay judges mix on the latency model: the offered load routed, request
// by request, to the replica with the lowest predicted TTFT (the latency
// scorer's choice), each replica's load account kept from the predicted
// first-token and end times of what it was sent, and each request counted
// by its chance of meeting every objective under the model's residual
// spread (within). Prompts are charged whole (the replay models no prefix
// cache).
func (p *Planner) replay(mix Mix) (Evaluation, error) {
	type replica struct {
		key    string
		active []cluster.RequestResult // sent and not yet ended, as predicted
	}
	var reps []*replica
	for i, n := range mix {
		for range n {
			reps = append(reps, &replica{key: p.Variants[i].Preset.Name})
		}
	}
	e := Evaluation{Mix: slices.Clone(mix)}
	if len(reps) == 0 {
		return e, nil
	}
	met := 0.0
	ttft := make([]float64, 0, len(p.Requests))
	tpot := make([]float64, 0, len(p.Requests))
	for _, r := range p.Requests {
		now, prompt := r.Arrival, r.PromptLen()
		best, est := -1, latency.Estimate{}
		var joined account
		for k, rp := range reps {
			rp.active = slices.DeleteFunc(rp.active, func(o cluster.RequestResult) bool { return o.Arrival+o.E2E <= now })
			var acct account
			for i := range rp.active {
				acct.add(&rp.active[i], now)
			}
			if x := p.Model.Predict(rp.key, acct.features(prompt, 0)); best < 0 || x.TTFT < est.TTFT {
				best, est, joined = k, x, acct
			}
		}
		// TPOT as the picker learns it: the batch the request joins.
		joined.joinDecode(prompt, r.OutputTokens)
		t := p.Model.Predict(reps[best].key, joined.features(prompt, prompt))
		est.TPOT, est.TPOTQuantile = t.TPOT, t.TPOTQuantile
		if p.SLO.TPOT > 0 && est.TPOT == 0 {
			return Evaluation{}, ErrNoTPOT
		}
		e2e := est.TTFT + time.Duration(max(0, r.OutputTokens-1))*est.TPOT
		reps[best].active = append(reps[best].active, cluster.RequestResult{Arrival: now, TTFT: est.TTFT, E2E: e2e, PromptTokens: prompt, OutputTokens: r.OutputTokens})
		ttft = append(ttft, est.TTFT.Seconds())
		chance := 1.0
		if p.SLO.TTFT > 0 {
			chance *= within(p.SLO.TTFT, est.TTFT, est.TTFTQuantile)
		}
		if r.OutputTokens > 1 {
			tpot = append(tpot, est.TPOT.Seconds())
			if p.SLO.TPOT > 0 {
				chance *= within(p.SLO.TPOT, est.TPOT, est.TPOTQuantile)
			}
		}
		met += chance
	}
	e.Met = met / float64(len(p.Requests))
	e.TTFTP90 = time.Duration(quantile(ttft, 0.9) * float64(time.Second))
	e.TPOTP90 = time.Duration(quantile(tpot, 0.9) * float64(time.Second))
	return e, nil
}

// within is the probability that a latency predicted as mean, with the
// model's high quantile at upper, is at most slo: the model's residuals are
// log-normal about its mean prediction, log(actual/mean) ~ N(0, σ) with σ
// from the quantile's multiple.
func within(slo, mean, upper time.Duration) float64 {
	if mean <= 0 {
		return 0
	}
	z := math.Log(float64(slo) / float64(mean))
	sigma := 0.0
	if upper > mean {
		sigma = math.Log(float64(upper)/float64(mean)) / zQuantile
	}
	if sigma == 0 {
		if z >= 0 {
			return 1
		}
		return 0
	}
	return 0.5 * math.Erfc(-z/(sigma*math.Sqrt2))
}

// ModelPlan is a plan made on the latency model and checked in the
// simulation.
type ModelPlan struct {
	// OnModel is the cheapest mix meeting the target on the model.
	OnModel *Plan
	// Checked is that mix simulated on the fleet.
	Checked Evaluation
	// Agree reports that the simulation meets the target with the model's
	// mix; Final is then OnModel, else the simulation planner's answer.
	Agree bool
	Final *Plan
}

// PlanOnModel plans on model (FitModel's) with the planner's variants, SLOs
// and load, and checks the answer on the simulated fleet. When the
// simulated fleet misses the target with the model's mix, the model has
// misjudged the fleet (the planner test shows where) and the answer is the
// simulation planner's.
func (p *Planner) PlanOnModel(ctx context.Context, model *latency.Model) (*ModelPlan, error) {
	mp := &Planner{Variants: p.Variants, SLO: p.SLO, Requests: p.Requests, Routing: p.Routing, Seed: p.Seed, Screen: p.Screen, Model: model}
	onModel, err := mp.Plan(ctx)
	if err != nil {
		return nil, fmt.Errorf("on the latency model: %w", err)
	}
	out := &ModelPlan{OnModel: onModel}
	if out.Checked, err = p.Evaluate(ctx, onModel.Best.Mix); err != nil {
		return nil, err
	}
	if out.Agree = p.Meets(out.Checked); out.Agree {
		final := *onModel
		final.Best, final.Simulated = out.Checked, len(p.evals)
		out.Final = &final
		return out, nil
	}
	if out.Final, err = p.Plan(ctx); err != nil {
		return nil, err
	}
	return out, nil
}
