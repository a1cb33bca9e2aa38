package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Chat generates multi-turn conversations: each conversation starts at a
// Poisson arrival, shares one of SystemPrompts system prompts, and sends
// Turns requests separated by ThinkTime, each prompt holding the whole
// conversation so far (system prompt, earlier user messages and replies)
// plus the new user message.
//
// The replies in later prompts are the generator's tokens, not the ones the
// simulated engine produced, so a turn reuses the cache of the previous
// turn's prompt but not of its decoded reply (a real server would also hit
// the reply's full blocks).
type Chat struct {
	SystemPrompts int
	SystemTokens  int
	UserTokens    int
	OutputTokens  int
	Turns         int
	ThinkTime     time.Duration
	// Stages are the rates at which conversations start.
	Stages []Stage
	// Burst, when above 1, starts conversations Burst at a time, the
	// instants Poisson at each stage's rate / Burst; each conversation's
	// later turns still follow its own think time, so a burst's turns stay
	// together only as long as the think time is constant.
	Burst int
}

// DefaultChat is a moderate chat workload.
func DefaultChat() Chat {
	return Chat{
		SystemPrompts: 8, SystemTokens: 1000, UserTokens: 200, OutputTokens: 200, Turns: 5,
		ThinkTime: 10 * time.Second, Stages: RampStages([]float64{1, 2, 4}, 60*time.Second),
	}
}

// Generate draws the requests with a generator seeded by seed; they are
// returned in arrival order.
func (c Chat) Generate(seed uint64) ([]Request, error) {
	if c.SystemPrompts < 1 || c.SystemTokens < 0 || c.UserTokens < 1 || c.OutputTokens < 1 || c.Turns < 1 || c.Turns > 1000 || c.ThinkTime < 0 {
		return nil, fmt.Errorf("%w: chat needs system prompts ≥ 1, user and output tokens ≥ 1, 1–1000 turns", ErrWorkload)
	}
	burst, err := checkBurst(c.Burst)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0xc4a7))
	var out []Request
	conv := uint64(0)
	err = poisson(rng, c.Stages, burst, func(at time.Duration, qps float64) {
		var hist []Segment
		if c.SystemTokens > 0 {
			hist = append(hist, Segment{Key: key(nsChatSystem, uint64(rng.IntN(c.SystemPrompts)), seed), Len: c.SystemTokens})
		}
		for turn := range c.Turns {
			user := Segment{Key: key(nsChatTurn, conv<<16|uint64(2*turn), seed), Len: c.UserTokens}
			hist = append(hist, user)
			if len(out) < maxGenerated {
				out = append(out, Request{Arrival: at, Segments: append([]Segment(nil), hist...), OutputTokens: c.OutputTokens, OfferedQPS: qps})
			}
			hist = append(hist, Segment{Key: key(nsChatTurn, conv<<16|uint64(2*turn+1), seed), Len: c.OutputTokens})
			at += c.ThinkTime
		}
		conv++
	})
	if err != nil {
		return nil, err
	}
	sortByArrival(out)
	return out, nil
}
