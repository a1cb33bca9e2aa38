package latency

import "math"

// rls is a recursive least-squares fit of y ≈ θ·x with forgetting, weighted
// by 1/y² so that it minimises relative error. n is the feature count.
type rls struct {
	n     int
	theta [maxFeatures]float64
	p     [maxFeatures][maxFeatures]float64
	// lambda forgets old samples: their weight decays by lambda per sample.
	lambda float64
}

const maxFeatures = 6

// initialCovariance is large: the prior (zero, or the pool's coefficients)
// is weak and the first samples dominate.
const initialCovariance = 1e4

func newRLS(n int, lambda float64, prior []float64) rls {
	r := rls{n: n, lambda: lambda}
	copy(r.theta[:n], prior)
	for i := range n {
		r.p[i][i] = initialCovariance
	}
	return r
}

// Every term of both models is work that adds time: a negative coefficient
// would let more backlog predict less latency, and a latency scorer would
// pile requests onto the busiest endpoint. Two ways to publish
// non-negative coefficients, each used where it measured better; the
// recursion itself stays unconstrained, which keeps its covariance exact.

// clamped zeroes negative coefficients and keeps the others. With
// correlated load features the partner of a zeroed term keeps compensating
// for it, so busy servers are over-predicted: the safe direction for a
// model that routes (TTFT). The re-solved fit below, tried for TTFT,
// under-predicted busy servers in bursts and let requests pile onto them
// (p99 TTFT 47 s vs 4.8 s on the bursty Mooncake trace at ×3).
func (r *rls) clamped() [maxFeatures]float64 {
	t := r.theta
	for i := range t {
		t[i] = max(0, t[i])
	}
	return t
}

// constrained returns the least-squares coefficients constrained to be
// non-negative: the coefficients of the active set S are fixed at zero and
// the others re-solved (with P the fit's inverse information matrix,
// θ_S=0 is θ − P[:,S]·P[S,S]⁻¹·θ[S]), S growing until none is negative.
// More accurate than clamping where correlated terms trade off (TPOT:
// MAPE 237% vs 916% on the saturated bursty chat workload; the engine
// twin's step cost: TTFT MAPE 5.5% vs 8.3% on the Poisson trace ×2).
func (r *rls) constrained() [maxFeatures]float64 {
	t := r.theta
	var active [maxFeatures]bool
	for range r.n {
		grew := false
		for i := range r.n {
			if t[i] < 0 && !active[i] {
				active[i], grew = true, true
			}
		}
		if !grew {
			break
		}
		var buf [maxFeatures]int
		s := buf[:0] // no allocation: this runs at every publish
		for i := range r.n {
			if active[i] {
				s = append(s, i)
			}
		}
		// Solve P[S,S]·λ = θ[S] (the unconstrained θ), then θ − P[:,S]·λ.
		var a [maxFeatures][maxFeatures + 1]float64
		for x, i := range s {
			for y, j := range s {
				a[x][y] = r.p[i][j]
			}
			a[x][len(s)] = r.theta[i]
		}
		lambda, ok := solve(&a, len(s))
		if !ok {
			break
		}
		t = r.theta
		for i := range r.n {
			for x, j := range s {
				t[i] -= r.p[i][j] * lambda[x]
			}
		}
		for _, i := range s {
			t[i] = 0 // exactly, not a rounding error away from it
		}
	}
	for i := range t {
		t[i] = max(0, t[i])
	}
	return t
}

// solve solves the n×n system in a (augmented with its right-hand side) by
// Gaussian elimination with partial pivoting; false when it is singular.
func solve(a *[maxFeatures][maxFeatures + 1]float64, n int) ([maxFeatures]float64, bool) {
	var x [maxFeatures]float64
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-300 {
			return x, false
		}
		a[c], a[p] = a[p], a[c]
		for r := c + 1; r < n; r++ {
			f := a[r][c] / a[c][c]
			for k := c; k <= n; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	for c := n - 1; c >= 0; c-- {
		s := a[c][n]
		for k := c + 1; k < n; k++ {
			s -= a[c][k] * x[k]
		}
		x[c] = s / a[c][c]
	}
	return x, true
}

// update takes one sample. A non-finite result (a degenerate sample)
// restores the coefficients from before it and resets the covariance,
// rather than poisoning the fit.
func (r *rls) update(x *[maxFeatures]float64, y float64) { r.updateRel(x, y, y, 0) }

// updateRel takes one sample whose error counts relative to ref: the twin
// fits y = θ·x where y includes the part of a step run before the
// decision, while what it predicts (and MAPE scores) is ref, the TTFT.
// With huber > 0 a sample the fit misses by more than that share of y
// weighs less, as Huber's loss weighs it (huber·y over the miss): the
// rest of its miss is what the model does not describe, not its
// coefficients' error.
func (r *rls) updateRel(x *[maxFeatures]float64, y, ref, huber float64) {
	before := r.theta
	if y <= 0 || ref <= 0 || math.IsNaN(y) || math.IsInf(y, 0) || math.IsNaN(ref) || math.IsInf(ref, 0) {
		return
	}
	// Relative error: scale the sample by 1/ref, the target becomes y/ref.
	var z [maxFeatures]float64
	for i := range r.n {
		z[i] = x[i] / ref
	}
	target := y / ref
	if miss := math.Abs(target - dot(&r.theta, &z)); huber > 0 && miss > huber*target {
		w := math.Sqrt(huber * target / miss)
		for i := range r.n {
			z[i] *= w
		}
		target *= w
	}
	var pz [maxFeatures]float64
	denom := r.lambda
	for i := range r.n {
		for j := range r.n {
			pz[i] += r.p[i][j] * z[j]
		}
		denom += z[i] * pz[i]
	}
	if denom <= 0 || math.IsNaN(denom) {
		return
	}
	err := target - dot(&r.theta, &z) // terms past n are zero in both
	for i := range r.n {
		r.theta[i] += pz[i] / denom * err
	}
	for i := range r.n {
		for j := range r.n {
			r.p[i][j] = (r.p[i][j] - pz[i]*pz[j]/denom) / r.lambda
		}
	}
	// Forgetting divides P by λ every sample; in a direction the samples
	// never excite (a feature that stays 0, like the busy indicator of an
	// idle server) nothing brings it back, and it would grow without bound.
	// Scaling row and column i by the same factor (D·P·D, D diagonal) keeps
	// P positive semi-definite while capping its diagonal at the prior's.
	for i := range r.n {
		if d := r.p[i][i]; d > initialCovariance {
			f := math.Sqrt(initialCovariance / d)
			for j := range r.n {
				r.p[i][j] *= f
				r.p[j][i] *= f
			}
		}
	}
	for i := range r.n {
		if math.IsNaN(r.theta[i]) || math.IsInf(r.theta[i], 0) || math.IsNaN(r.p[i][i]) {
			fresh := newRLS(r.n, r.lambda, before[:r.n])
			*r = fresh
			return
		}
	}
}

// quantile estimates the q-th quantile of a stream of log residuals
// (log of actual over predicted) as mean + z_q·sd of a log-normal fit, with
// running moments that average exactly over the first samples and then
// forget at forgetRate. Stochastic-approximation trackers need hundreds of
// samples and jitter by their step; moments settle in tens.
type quantile struct {
	z          float64 // the standard normal's q-quantile
	n          float64
	mean, m2   float64
	forgetRate float64
	value      float64
}

func newQuantile(q, forgetRate float64) quantile {
	return quantile{z: math.Sqrt2 * math.Erfinv(2*q-1), forgetRate: forgetRate}
}

func (t *quantile) observe(v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	t.n++
	w := max(1/t.n, t.forgetRate)
	d := v - t.mean
	t.mean += w * d
	t.m2 = (1 - w) * (t.m2 + w*d*d)
	t.value = t.mean + t.z*math.Sqrt(t.m2)
}
