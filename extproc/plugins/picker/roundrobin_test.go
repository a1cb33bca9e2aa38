package picker

import (
	"context"
	"sync"
	"testing"
)

func TestRoundRobin(t *testing.T) {
	tests := []struct {
		params string
		picks  int
		want   []string
	}{
		{"", 5, []string{"a", "b", "c", "a", "b"}},
		{`{"maxNumOfEndpoints": 2}`, 4, []string{"ab", "bc", "ca", "ab"}},
		{`{"maxNumOfEndpoints": 9}`, 2, []string{"abc", "bca"}},
	}
	for _, tc := range tests {
		p := build(t, NewRoundRobin, tc.params)
		for i := range tc.picks {
			// Scores must not matter.
			got := names(p.Pick(context.Background(), nil, nil, scored(0.1, 0.9, 0.5)))
			if got != tc.want[i] {
				t.Errorf("%s pick %d: got %q want %q", tc.params, i, got, tc.want[i])
			}
		}
	}
	if r := build(t, NewRoundRobin, "").Pick(context.Background(), nil, nil, nil); r != nil {
		t.Errorf("no candidates: got %v", r)
	}
}

// Concurrent requests must share the rotation: over a multiple of the pool
// size every endpoint is picked equally often.
func TestRoundRobinConcurrentIsEven(t *testing.T) {
	p := build(t, NewRoundRobin, "")
	const workers, each = 4, 300
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			local := map[string]int{}
			for range each {
				local[names(p.Pick(context.Background(), nil, nil, scored(0, 0, 0)))]++
			}
			mu.Lock()
			for k, v := range local {
				seen[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, n := range []string{"a", "b", "c"} {
		if seen[n] != workers*each/3 {
			t.Fatalf("uneven rotation: %v", seen)
		}
	}
}

func TestRoundRobinParams(t *testing.T) {
	if _, err := NewRoundRobin("", []byte(`{"maxNumOfEndpoints": 0}`), nil); err == nil {
		t.Error("maxNumOfEndpoints 0 accepted")
	}
}
