package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// The traffic classes of a Mixed workload, named as the InferenceObjectives
// their requests carry.
const (
	ObjectiveOnline = "online"
	ObjectiveBatch  = "batch"
)

// Mixed is online chat traffic sharing the fleet with a batch stream: the
// chat's requests name the objective "online", the batch's "batch" (the
// benchmark gives batch a negative, sheddable priority).
type Mixed struct {
	Online Chat
	// OnlineTimeout is how long an online client waits for its response
	// to start; zero for ever.
	OnlineTimeout time.Duration
	Batch         Batch
}

// Batch is a Poisson stream of independent requests (unique prompts); its
// requests carry no OfferedQPS, so that the load stages report the online
// traffic.
type Batch struct {
	QPS          float64
	PromptTokens int
	OutputTokens int
	// Duration is how long the stream runs; zero: as long as the online
	// traffic's arrivals.
	Duration time.Duration
	Timeout  time.Duration
}

// Generate draws both classes with generators seeded by seed, merged in
// arrival order. A batch QPS of 0 gives the online traffic alone, and
// online stages of rate 0 the batch alone (for as long as the stages last).
func (m Mixed) Generate(seed uint64) ([]Request, error) {
	var out []Request
	online := false
	for _, st := range m.Online.Stages {
		online = online || st.QPS > 0
	}
	if online {
		reqs, err := m.Online.Generate(seed)
		if err != nil {
			return nil, err
		}
		for i := range reqs {
			reqs[i].Objective, reqs[i].Timeout = ObjectiveOnline, m.OnlineTimeout
		}
		out = reqs
	}
	b := m.Batch
	if b.QPS < 0 || (b.QPS > 0 && (b.PromptTokens < 1 || b.OutputTokens < 1)) {
		return nil, fmt.Errorf("%w: batch needs QPS ≥ 0 and prompt and output tokens ≥ 1", ErrWorkload)
	}
	if b.QPS > 0 {
		d := b.Duration
		if d == 0 {
			for _, st := range m.Online.Stages {
				d += st.Duration
			}
		}
		rng := rand.New(rand.NewPCG(seed, 0xba7c))
		n := uint64(0)
		err := poisson(rng, []Stage{{QPS: b.QPS, Duration: d}}, 1, func(at time.Duration, _ float64) {
			if len(out) < maxGenerated {
				out = append(out, Request{Arrival: at, Segments: []Segment{{Key: key(nsBatch, n, seed), Len: b.PromptTokens}},
					OutputTokens: b.OutputTokens, Objective: ObjectiveBatch, Timeout: b.Timeout})
			}
			n++
		})
		if err != nil {
			return nil, err
		}
	}
	sortByArrival(out)
	return out, nil
}
