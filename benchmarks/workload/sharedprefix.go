package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Stage is a period of constant offered load.
type Stage struct {
	QPS      float64
	Duration time.Duration
}

// SharedPrefix is llm-d's shared-prefix benchmark shape: Groups groups,
// each with its own PrefixTokens-long prefix (a system prompt), every
// request adding SuffixTokens unique tokens; arrivals are Poisson at each
// stage's rate, and each request belongs to a group drawn uniformly.
type SharedPrefix struct {
	Groups       int
	PrefixTokens int
	SuffixTokens int
	OutputTokens int
	Stages       []Stage
	// Burst, when above 1, sends requests in bursts of Burst at one
	// instant, the instants Poisson at each stage's rate / Burst, so that
	// the mean rate is unchanged.
	Burst int
}

// LLMDSharedPrefix is the setup of llm-d's "KV-cache wins you can see"
// benchmark (REFERENCE §9): 150 groups sharing 6k-token prefixes, a load
// ramp from 3 to 60 QPS.
func LLMDSharedPrefix() SharedPrefix {
	return SharedPrefix{
		Groups: 150, PrefixTokens: 6000, SuffixTokens: 1200, OutputTokens: 1000,
		Stages: RampStages([]float64{3, 10, 20, 30, 40, 50, 60}, 30*time.Second),
	}
}

// RampStages gives each rate in qps the same duration.
func RampStages(qps []float64, each time.Duration) []Stage {
	out := make([]Stage, len(qps))
	for i, q := range qps {
		out[i] = Stage{QPS: q, Duration: each}
	}
	return out
}

// maxGenerated bounds a generated workload.
const maxGenerated = 1 << 20

// ErrWorkload reports generator parameters that cannot make a workload.
var ErrWorkload = errors.New("invalid workload")

// Generate draws the requests with a generator seeded by seed.
func (c SharedPrefix) Generate(seed uint64) ([]Request, error) {
	if c.Groups < 1 || c.PrefixTokens < 0 || c.SuffixTokens < 0 || c.PrefixTokens+c.SuffixTokens < 1 || c.OutputTokens < 1 {
		return nil, fmt.Errorf("%w: shared-prefix needs groups ≥ 1, a non-empty prompt and output ≥ 1", ErrWorkload)
	}
	burst, err := checkBurst(c.Burst)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var out []Request
	err = poisson(rng, c.Stages, burst, func(at time.Duration, qps float64) {
		g := uint64(rng.IntN(c.Groups))
		segs := make([]Segment, 0, 2)
		if c.PrefixTokens > 0 {
			segs = append(segs, Segment{Key: key(nsGroupPrefix, g, seed), Len: c.PrefixTokens})
		}
		if c.SuffixTokens > 0 {
			segs = append(segs, Segment{Key: key(nsUnique, uint64(len(out)), seed), Len: c.SuffixTokens})
		}
		out = append(out, Request{Arrival: at, Segments: segs, OutputTokens: c.OutputTokens, OfferedQPS: qps})
	})
	return out, err
}

// poisson calls emit for every arrival of a Poisson process through the
// stages, in order: burst arrivals at each instant of a Poisson process at
// the stage's rate / burst (burst >= 1).
func poisson(rng *rand.Rand, stages []Stage, burst int, emit func(at time.Duration, qps float64)) error {
	if len(stages) == 0 {
		return fmt.Errorf("%w: no load stages", ErrWorkload)
	}
	var expected float64
	for _, s := range stages {
		if s.QPS <= 0 || s.Duration <= 0 || math.IsInf(s.QPS, 0) || math.IsNaN(s.QPS) {
			return fmt.Errorf("%w: stage %v QPS for %v", ErrWorkload, s.QPS, s.Duration)
		}
		expected += s.QPS * s.Duration.Seconds()
	}
	if expected > maxGenerated/2 {
		return fmt.Errorf("%w: about %.0f requests, more than %d", ErrWorkload, expected, maxGenerated/2)
	}
	var start time.Duration
	n := 0
	for _, s := range stages {
		t := start
		rate := s.QPS / float64(burst)
		for n < maxGenerated {
			t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if t >= start+s.Duration {
				break
			}
			for range min(burst, maxGenerated-n) {
				emit(t, s.QPS)
				n++
			}
		}
		start += s.Duration
	}
	return nil
}
