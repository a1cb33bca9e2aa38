package latency

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// server is a synthetic ground truth shaped like a continuous-batching
// server: a prefill rate slowed by the decode batch, and a step time.
type server struct {
	rate  float64 // prefill tokens/s when idle
	step  float64 // decode step of a lone sequence, seconds
	noise float64 // relative noise
}

func (s server) ttft(f Features, rng *rand.Rand) float64 {
	w := f.Prefill + f.Backlog
	return (0.005 + w/s.rate*(1+f.Decodes/200)) * (1 + s.noise*rng.NormFloat64())
}

func (s server) tpot(f Features, rng *rand.Rand) float64 {
	chunk := 0.0
	if f.Backlog > 0 {
		chunk = 2 * s.step // a prefill chunk shares every step
	}
	return (s.step + s.step*f.Decodes/50 + chunk) * (1 + s.noise*rng.NormFloat64())
}

func randomFeatures(rng *rand.Rand) Features {
	return Features{
		Prefill: float64(rng.IntN(12000) + 1), Backlog: float64(rng.IntN(30000)),
		Decodes: float64(rng.IntN(64)), DecodeTokens: float64(rng.IntN(400000)),
	}
}

func TestModelLearnsEachEndpointsSpeed(t *testing.T) {
	servers := map[string]server{
		"10.0.0.1:8000": {rate: 12000, step: 0.012, noise: 0.03}, // slower card
		"10.0.0.2:8000": {rate: 24000, step: 0.008, noise: 0.03}, // faster card
	}
	tests := []struct {
		name     string
		samples  int
		maxMAPE  float64
		rateTol  float64
		quantile float64
		// quantileTol: the residual quantile settles over hundreds of
		// samples; a young fit is only checked for its mean.
		quantileTol float64
	}{
		{name: "few samples", samples: 100, maxMAPE: 0.10, rateTol: 0.25, quantile: 0.9, quantileTol: 0.1},
		{name: "many samples", samples: 2000, maxMAPE: 0.05, rateTol: 0.10, quantile: 0.9, quantileTol: 0.05},
		{name: "median", samples: 2000, maxMAPE: 0.05, rateTol: 0.10, quantile: 0.5, quantileTol: 0.09},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			m := New(Config{Quantile: tt.quantile})
			for range tt.samples {
				for addr, s := range servers {
					f := randomFeatures(rng)
					m.ObserveTTFT(addr, f, time.Duration(s.ttft(f, rng)*1e9))
					m.ObserveTPOT(addr, f, time.Duration(s.tpot(f, rng)*1e9))
				}
			}
			for addr, s := range servers {
				var ape, apeTPOT float64
				below := 0
				const n = 2000
				for range n {
					f := randomFeatures(rng)
					e := m.Predict(addr, f)
					actual := s.ttft(f, rng)
					ape += math.Abs(e.TTFT.Seconds()-actual) / actual
					if actual <= e.TTFTQuantile.Seconds() {
						below++
					}
					at := s.tpot(f, rng)
					apeTPOT += math.Abs(e.TPOT.Seconds()-at) / at
				}
				if mape := ape / n; mape > tt.maxMAPE {
					t.Errorf("%s: TTFT MAPE %.3f > %.2f", addr, mape, tt.maxMAPE)
				}
				if mape := apeTPOT / n; mape > tt.maxMAPE {
					t.Errorf("%s: TPOT MAPE %.3f > %.2f", addr, mape, tt.maxMAPE)
				}
				if share := float64(below) / n; share < tt.quantile-tt.quantileTol || (tt.quantileTol < 0.1 && share > tt.quantile+tt.quantileTol) {
					t.Errorf("%s: %.2f of actual TTFTs below the predicted p%.0f", addr, share, tt.quantile*100)
				}
			}
			rates := map[string]float64{}
			for _, f := range m.Fits() {
				rates[f.Address] = f.PrefillTokensPerSecond
			}
			for addr, s := range servers {
				if got := rates[addr]; math.Abs(got-s.rate)/s.rate > tt.rateTol {
					t.Errorf("%s: learned prefill rate %.0f tok/s, want %.0f ± %.0f%%", addr, got, s.rate, tt.rateTol*100)
				}
			}
		})
	}
}

func TestModelBeforeSamplesUsesPool(t *testing.T) {
	m := New(Config{MinSamples: 4})
	f := Features{Prefill: 1000}
	cold := m.Predict("10.0.0.9:8000", f)
	// TTFT starts from the prior; TPOT is unknown (0) until streams end.
	if cold.TTFT <= 0 || cold.TPOT != 0 || cold.TTFTQuantile < cold.TTFT {
		t.Fatalf("cold estimate %+v", cold)
	}
	// Samples of another endpoint move the pool fit, which a new endpoint
	// inherits.
	for range 50 {
		m.ObserveTTFT("10.0.0.1:8000", f, 2*time.Second)
	}
	if got := m.Predict("10.0.0.9:8000", f).TTFT; got < time.Second {
		t.Errorf("new endpoint predicts %v, want the pool's ≈2s", got)
	}
	m.Forget("10.0.0.1:8000")
	if len(m.Fits()) != 0 {
		t.Errorf("fits after Forget: %+v", m.Fits())
	}
}

func TestModelBoundsEndpoints(t *testing.T) {
	m := New(Config{MaxEndpoints: 2})
	for _, a := range []string{"a", "b", "a", "c"} {
		m.ObserveTTFT(a, Features{Prefill: 10}, time.Millisecond)
	}
	got := map[string]bool{}
	for _, f := range m.Fits() {
		got[f.Address] = true
	}
	// b learned least recently: it made room for c.
	if len(got) != 2 || !got["a"] || !got["c"] {
		t.Errorf("tracked %v, want a and c", got)
	}
}

func TestModelIgnoresDegenerateSamples(t *testing.T) {
	m := New(Config{})
	for _, d := range []time.Duration{0, -time.Second} {
		m.ObserveTTFT("a", Features{Prefill: 10}, d)
	}
	m.ObserveTTFT("a", Features{Prefill: math.Inf(1)}, time.Second)
	e := m.Predict("a", Features{Prefill: 100})
	if e.TTFT <= 0 || math.IsNaN(float64(e.TTFT)) {
		t.Fatalf("estimate after degenerate samples: %+v", e)
	}
}

func BenchmarkPredict(b *testing.B) {
	m := New(Config{})
	for i := range 64 {
		m.ObserveTTFT("10.0.0.1:8000", Features{Prefill: float64(i * 100)}, time.Duration(i+1)*time.Millisecond)
	}
	f := Features{Prefill: 1000, Backlog: 5000, Decodes: 20, DecodeTokens: 1e5}
	b.ReportAllocs()
	for b.Loop() {
		_ = m.Predict("10.0.0.1:8000", f)
	}
}

// With correlated features, the constrained fit re-solves the others when
// one coefficient is held at zero, rather than dropping it and keeping a
// partner that compensated for it.
func TestMonotoneFitWithCorrelatedFeatures(t *testing.T) {
	r := newRLS(2, 1, nil)
	// y = 1·x0 exactly, but x1 = x0 + small noise makes an unconstrained
	// fit free to trade one for the other; force it negative on x1 by a
	// few samples where y grows slower than x1.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		x0 := 1 + rng.Float64()
		x1 := x0 + 0.3*rng.Float64()
		y := x0 - 0.5*(x1-x0)
		r.update(&[maxFeatures]float64{x0, x1}, y)
	}
	if r.theta[1] >= 0 {
		t.Fatalf("setup: unconstrained θ = %v, want a negative θ1", r.theta[:2])
	}
	c := r.constrained()
	if c[1] != 0 || c[0] <= 0 {
		t.Fatalf("constrained θ = %v", c[:2])
	}
	// Refitted on x0 alone, y ≈ 0.9·x0 on these samples: far from the
	// unconstrained θ0, which the negative θ1 offset.
	var worst float64
	for range 200 {
		x0 := 1 + rng.Float64()
		x1 := x0 + 0.3*rng.Float64()
		y := x0 - 0.5*(x1-x0)
		worst = max(worst, math.Abs(c[0]*x0-y)/y)
	}
	if worst > 0.1 {
		t.Errorf("constrained fit misses by up to %.0f%%", worst*100)
	}
}

// A feature that never varies (the busy indicator of an idle server) is a
// direction forgetting would inflate without bound; the fit must stay put
// over far more samples than it takes to overflow, not reset to zero.
func TestLongRunWithUnexcitedFeature(t *testing.T) {
	m := New(Config{})
	rng := rand.New(rand.NewPCG(5, 6))
	truth := func(f Features) float64 { return 0.005 + f.Prefill/20000 }
	var worst float64
	for i := range 30000 {
		f := Features{Prefill: float64(1 + rng.IntN(8000))} // no backlog: busy stays 0
		m.ObserveTTFT("a", f, time.Duration(truth(f)*1e9))
		if i > 1000 && i%97 == 0 {
			probe := Features{Prefill: 4000}
			e := m.Predict("a", probe).TTFT.Seconds()
			worst = max(worst, math.Abs(e-truth(probe))/truth(probe))
		}
	}
	if worst > 0.05 {
		t.Fatalf("prediction strayed %.0f%% from the truth during a long run", worst*100)
	}
}

// Predictions stay finite and positive whatever the fit did.
func TestSecondsIsBounded(t *testing.T) {
	for _, s := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 1e300, -5, 0} {
		if d := seconds(s); d <= 0 || d > time.Duration(maxPrediction*float64(time.Second)) {
			t.Errorf("seconds(%v) = %v", s, d)
		}
	}
}

// TestModelPricesTheStepInProgress: a short prompt's TTFT on an idle-looking
// server is mostly the decode step it lands in; with the step clock's
// estimate as a feature the fit recovers that wait instead of averaging it.
func TestModelPricesTheStepInProgress(t *testing.T) {
	const step = 0.02
	truth := func(f Features) float64 { return f.StepRemaining + 0.003 + f.Prefill/20000 }
	rng := rand.New(rand.NewPCG(3, 4))
	sample := func() Features {
		return Features{Prefill: float64(rng.IntN(200) + 1), Decodes: 8, DecodeTokens: 40000, StepRemaining: step * rng.Float64()}
	}
	mape := func(blind bool) float64 {
		m := New(Config{})
		for range 1500 {
			f := sample()
			y := truth(f)
			if blind {
				f.StepRemaining = 0
			}
			m.ObserveTTFT("10.0.0.1:8000", f, time.Duration(y*1e9))
		}
		ape := 0.0
		const n = 1000
		for range n {
			f := sample()
			y := truth(f)
			if blind {
				f.StepRemaining = 0
			}
			ape += math.Abs(m.Predict("10.0.0.1:8000", f).TTFT.Seconds()-y) / y
		}
		return ape / n
	}
	seeing, blind := mape(false), mape(true)
	if seeing > 0.05 || seeing > blind/4 {
		t.Fatalf("TTFT MAPE with the step clock %.1f%%, without %.1f%%: want under 5%% and a quarter of the blind fit's", 100*seeing, 100*blind)
	}
}
