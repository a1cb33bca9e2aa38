package latency

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRobustFitIgnoresOutliers: with one sample in ten taking 1.5 to 4
// times what the model describes (work it was not told of), the Huber
// weight keeps the fit within 10 % of the true step cost (7.5 % here),
// where the plain fit drifts by a third.
func TestRobustFitIgnoresOutliers(t *testing.T) {
	truth := [maxFeatures]float64{0.004, 0.03, 0, 0.002, 0, 0}
	worst := func(huber float64, outliers float64) float64 {
		rng := rand.New(rand.NewPCG(7, 11))
		r := newRLS(twinFeatures, DefaultForgetting, twinPrior)
		for range 4000 {
			x := [maxFeatures]float64{1 + float64(rng.IntN(3)), rng.Float64() * 10, 0, rng.Float64() * 2, 0, 0}
			y := dot(&truth, &x)
			if rng.Float64() < outliers {
				y *= 1.5 + 2.5*rng.Float64()
			}
			r.updateRel(&x, y, y, huber)
		}
		var w float64
		for i, c := range truth {
			if c > 0 {
				w = max(w, math.Abs(r.theta[i]-c)/c)
			}
		}
		return w
	}
	tests := []struct {
		name            string
		huber, outliers float64
		ok              func(float64) bool
	}{
		{"clean, plain", 0, 0, func(e float64) bool { return e < 1e-3 }},
		{"clean, robust", twinHuber, 0, func(e float64) bool { return e < 1e-3 }},
		{"outliers, robust", twinHuber, 0.1, func(e float64) bool { return e < 0.1 }},
		{"outliers, plain", 0, 0.1, func(e float64) bool { return e > 0.2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if e := worst(tt.huber, tt.outliers); !tt.ok(e) {
				t.Fatalf("worst coefficient error %.4f", e)
			}
		})
	}
}
