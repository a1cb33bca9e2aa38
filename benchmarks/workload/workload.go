package workload

import (
	"sort"
	"time"
)

// Segment is a run of Len tokens derived from Key.
type Segment struct {
	Key uint64
	Len int
}

// Request is one request of a workload.
type Request struct {
	// Arrival is the offset from the start of the workload.
	Arrival time.Duration
	// Segments concatenate into the prompt.
	Segments []Segment
	// OutputTokens is how many tokens the model generates.
	OutputTokens int
	// OfferedQPS is the arrival rate of the stage the request belongs to;
	// zero when the workload has no stages (a trace).
	OfferedQPS float64
	// Objective is the InferenceObjective the request names (its traffic
	// class, and so its priority); "" for none.
	Objective string
	// Timeout is how long its client waits for a response to start before
	// giving up; zero waits for ever.
	Timeout time.Duration
}

// PromptLen is the prompt's length in tokens.
func (r *Request) PromptLen() int {
	n := 0
	for _, s := range r.Segments {
		n += s.Len
	}
	return n
}

// Prompt expands the segments into token ids, keeping at most limit tokens
// (limit <= 0 keeps all): a prompt longer than a model's context is cut at
// its end, so that the shared prefix survives.
func (r *Request) Prompt(limit int) []int {
	n := r.PromptLen()
	if limit > 0 && n > limit {
		n = limit
	}
	out := make([]int, 0, n)
	for _, s := range r.Segments {
		if len(out) == n {
			break
		}
		out = appendTokens(out, s.Key, min(s.Len, n-len(out)))
	}
	return out
}

// vocab bounds generated token ids: below every preset model's vocabulary
// and above the special-token range of common tokenizers.
const (
	vocabLow  = 1000
	vocabSpan = 30000
)

// appendTokens appends the first n tokens of the segment named key.
func appendTokens(dst []int, key uint64, n int) []int {
	for i := range n {
		dst = append(dst, vocabLow+int(mix(key^mix(uint64(i)+0x632be59bd9b4e019))%vocabSpan))
	}
	return dst
}

// mix is splitmix64's finaliser: a bijection that scrambles keys so that
// nearby keys give unrelated tokens.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Key namespaces keep segments of different generators from colliding.
const (
	nsMooncake uint64 = iota + 1
	nsGroupPrefix
	nsUnique
	nsChatSystem
	nsChatTurn
	nsBatch
)

func key(ns uint64, a, b uint64) uint64 { return mix(mix(ns<<56^a) ^ b) }

// ScaleQPS divides every arrival offset by x, multiplying the offered load
// by x; x <= 0 leaves the requests unchanged. It returns a new slice.
func ScaleQPS(reqs []Request, x float64) []Request {
	out := make([]Request, len(reqs))
	copy(out, reqs)
	if x <= 0 || x == 1 {
		return out
	}
	for i := range out {
		out[i].Arrival = time.Duration(float64(out[i].Arrival) / x)
		out[i].OfferedQPS *= x
	}
	return out
}

// sortByArrival orders requests by arrival, keeping the given order among
// equal arrivals so that a workload's order is deterministic.
func sortByArrival(reqs []Request) {
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
}

// Stats summarises a workload.
type Stats struct {
	Requests     int
	PromptTokens int64
	OutputTokens int64
	Duration     time.Duration
}

// Summarize computes a workload's Stats.
func Summarize(reqs []Request) Stats {
	s := Stats{Requests: len(reqs)}
	for i := range reqs {
		s.PromptTokens += int64(reqs[i].PromptLen())
		s.OutputTokens += int64(reqs[i].OutputTokens)
		s.Duration = max(s.Duration, reqs[i].Arrival)
	}
	return s
}
