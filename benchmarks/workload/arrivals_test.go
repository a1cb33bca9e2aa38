package workload

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

func TestQuantizeArrivals(t *testing.T) {
	ms := time.Millisecond
	// OutputTokens tags each request so that the order can be checked.
	in := func(arrivals ...time.Duration) []Request {
		out := make([]Request, len(arrivals))
		for i, a := range arrivals {
			out[i] = Request{Arrival: a, OutputTokens: i}
		}
		return out
	}
	tests := []struct {
		name     string
		reqs     []Request
		q        time.Duration
		arrivals []time.Duration
		order    []int
	}{
		{"floors to the quantum", in(0, 999*ms, 1000*ms, 1500*ms, 3001*ms), time.Second,
			[]time.Duration{0, 0, 1000 * ms, 1000 * ms, 3000 * ms}, []int{0, 1, 2, 3, 4}},
		{"zero quantum keeps arrivals", in(1*ms, 7*ms), 0, []time.Duration{1 * ms, 7 * ms}, []int{0, 1}},
		{"negative quantum keeps arrivals", in(1*ms, 7*ms), -time.Second, []time.Duration{1 * ms, 7 * ms}, []int{0, 1}},
		{"unsorted input is sorted, ties keep their order", in(2500*ms, 2100*ms, 300*ms, 2900*ms), time.Second,
			[]time.Duration{0, 2000 * ms, 2000 * ms, 2000 * ms}, []int{2, 0, 1, 3}},
		{"quantum above every arrival", in(5*ms, 10*ms), time.Minute, []time.Duration{0, 0}, []int{0, 1}},
		{"empty", nil, time.Second, []time.Duration{}, []int{}},
	}
	for _, tc := range tests {
		orig := slices.Clone(tc.reqs)
		got := QuantizeArrivals(tc.reqs, tc.q)
		arr, order := []time.Duration{}, []int{}
		for _, r := range got {
			arr, order = append(arr, r.Arrival), append(order, r.OutputTokens)
		}
		if !slices.Equal(arr, tc.arrivals) || !slices.Equal(order, tc.order) {
			t.Errorf("%s: arrivals %v order %v, want %v %v", tc.name, arr, order, tc.arrivals, tc.order)
		}
		if !slices.EqualFunc(tc.reqs, orig, func(a, b Request) bool { return a.Arrival == b.Arrival }) {
			t.Errorf("%s: input modified", tc.name)
		}
	}
}

// burstSizes counts the requests arriving at each instant.
func burstSizes(reqs []Request) map[time.Duration]int {
	n := map[time.Duration]int{}
	for _, r := range reqs {
		n[r.Arrival]++
	}
	return n
}

func TestSharedPrefixBursts(t *testing.T) {
	const qps, secs = 20.0, 300
	for _, burst := range []int{0, 1, 4, 10} {
		c := SharedPrefix{Groups: 3, PrefixTokens: 10, SuffixTokens: 2, OutputTokens: 1,
			Stages: []Stage{{QPS: qps, Duration: secs * time.Second}}, Burst: burst}
		reqs, err := c.Generate(11)
		if err != nil {
			t.Fatal(err)
		}
		size := max(burst, 1)
		// The burst instants are Poisson with mean qps·secs/size: allow 5
		// standard deviations of their count, times the burst size.
		instants := qps * secs / float64(size)
		if d := math.Abs(float64(len(reqs)) - qps*secs); d > 5*math.Sqrt(instants)*float64(size) {
			t.Errorf("burst %d: %d requests, want ≈ %v", burst, len(reqs), qps*secs)
		}
		for at, n := range burstSizes(reqs) {
			if n != size {
				t.Fatalf("burst %d: %d requests at %v", burst, n, at)
			}
		}
		for i := 1; i < len(reqs); i++ {
			if reqs[i].Arrival < reqs[i-1].Arrival {
				t.Fatalf("burst %d: not in arrival order at %d", burst, i)
			}
		}
	}
	bad := SharedPrefix{Groups: 1, PrefixTokens: 1, OutputTokens: 1, Stages: []Stage{{QPS: 1, Duration: time.Second}}, Burst: -1}
	if _, err := bad.Generate(1); !errors.Is(err, ErrWorkload) {
		t.Errorf("negative burst: err = %v", err)
	}
}

// A chat burst is several conversations starting together; each keeps its
// own turns.
func TestChatBursts(t *testing.T) {
	c := Chat{SystemPrompts: 2, SystemTokens: 5, UserTokens: 3, OutputTokens: 2, Turns: 3, ThinkTime: 4 * time.Second,
		Stages: []Stage{{QPS: 2, Duration: 200 * time.Second}}, Burst: 5}
	reqs, err := c.Generate(9)
	if err != nil {
		t.Fatal(err)
	}
	convs := map[Segment][]time.Duration{}
	var firsts []Request
	for _, r := range reqs {
		if len(r.Segments) == 2 {
			firsts = append(firsts, r)
		}
		convs[r.Segments[1]] = append(convs[r.Segments[1]], r.Arrival)
	}
	// 400 conversations expected in 80 bursts: 5 standard deviations of
	// the burst count.
	if d := math.Abs(float64(len(firsts)) - 400); d > 5*math.Sqrt(80)*5 {
		t.Errorf("%d conversations, want ≈ 400", len(firsts))
	}
	for at, n := range burstSizes(firsts) {
		if n != 5 {
			t.Fatalf("%d conversations start at %v", n, at)
		}
	}
	for k, turns := range convs {
		if len(turns) != 3 || turns[1]-turns[0] != 4*time.Second || turns[2]-turns[1] != 4*time.Second {
			t.Fatalf("conversation %v: turns at %v", k, turns)
		}
	}
}
