package kvindex

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"
)

type op struct {
	remove    bool
	clear     bool
	clearTier bool // only tier
	ep        string
	tier      Tier
	hashes    []uint64
}

func TestLookup(t *testing.T) {
	a, b, c := "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
	tests := []struct {
		name    string
		ops     []op
		prompt  []uint64
		cands   []string
		want    []float64
		matched int
	}{
		{
			name:    "empty index",
			prompt:  []uint64{1, 2, 3},
			cands:   []string{a, b},
			want:    []float64{0, 0},
			matched: 0,
		},
		{
			name:    "longest leading run per endpoint",
			ops:     []op{{ep: a, hashes: []uint64{1, 2, 3}}, {ep: b, hashes: []uint64{1}}},
			prompt:  []uint64{1, 2, 3, 4},
			cands:   []string{a, b, c},
			want:    []float64{3, 1, 0},
			matched: 3,
		},
		{
			name:    "run must start at block 0",
			ops:     []op{{ep: a, hashes: []uint64{2, 3}}},
			prompt:  []uint64{1, 2, 3},
			cands:   []string{a},
			want:    []float64{0},
			matched: 0,
		},
		{
			name:    "a hole ends the run",
			ops:     []op{{ep: a, hashes: []uint64{1, 3, 4}}},
			prompt:  []uint64{1, 2, 3, 4},
			cands:   []string{a},
			want:    []float64{1},
			matched: 1,
		},
		{
			name:    "cpu blocks weigh less",
			ops:     []op{{ep: a, tier: TierCPU, hashes: []uint64{1, 2}}, {ep: a, hashes: []uint64{3}}},
			prompt:  []uint64{1, 2, 3},
			cands:   []string{a},
			want:    []float64{2*WeightCPU + WeightGPU},
			matched: 3,
		},
		{
			name:    "best tier counts",
			ops:     []op{{ep: a, tier: TierCPU, hashes: []uint64{1, 2}}, {ep: a, hashes: []uint64{1, 2}}},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{2},
			matched: 2,
		},
		{
			name: "removing one tier keeps the other",
			ops: []op{
				{ep: a, hashes: []uint64{1, 2}}, {ep: a, tier: TierCPU, hashes: []uint64{1, 2}},
				{remove: true, ep: a, hashes: []uint64{1, 2}},
			},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{2 * WeightCPU},
			matched: 2,
		},
		{
			// vLLM's block pool can hold two blocks with one hash (two
			// requests computed it at once); it announces each with a
			// BlockStored and each eviction with a BlockRemoved.
			name: "a block stored twice outlives one removal",
			ops: []op{
				{ep: a, hashes: []uint64{1, 2}}, {ep: a, hashes: []uint64{1}},
				{remove: true, ep: a, hashes: []uint64{1}},
			},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{2},
			matched: 2,
		},
		{
			name: "each stored copy needs its removal",
			ops: []op{
				{ep: a, hashes: []uint64{1, 2}}, {ep: a, hashes: []uint64{1}},
				{remove: true, ep: a, hashes: []uint64{1}}, {remove: true, ep: a, hashes: []uint64{1}},
			},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{0},
			matched: 0,
		},
		{
			name: "copies count per tier",
			ops: []op{
				{ep: a, tier: TierCPU, hashes: []uint64{1}}, {ep: a, tier: TierCPU, hashes: []uint64{1}},
				{ep: a, hashes: []uint64{1}}, {remove: true, ep: a, hashes: []uint64{1}},
				{remove: true, ep: a, tier: TierCPU, hashes: []uint64{1}},
			},
			prompt:  []uint64{1},
			cands:   []string{a},
			want:    []float64{WeightCPU},
			matched: 1,
		},
		{
			name: "clearing a tier keeps the endpoint's other tier",
			ops: []op{
				{ep: a, hashes: []uint64{1, 2, 3}}, {ep: a, tier: TierCPU, hashes: []uint64{1, 2}},
				{ep: b, hashes: []uint64{1}}, {clearTier: true, ep: a, tier: TierGPU},
			},
			prompt:  []uint64{1, 2, 3},
			cands:   []string{a, b},
			want:    []float64{2 * WeightCPU, 1},
			matched: 2,
		},
		{
			name: "clearing a tier drops the blocks held only there",
			ops: []op{
				{ep: a, hashes: []uint64{1, 2}}, {ep: a, tier: TierCPU, hashes: []uint64{2}},
				{clearTier: true, ep: a, tier: TierGPU},
			},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{0},
			matched: 0,
		},
		{
			name: "clearing a tier forgets the copies counted in it",
			ops: []op{
				{ep: a, hashes: []uint64{1}}, {ep: a, hashes: []uint64{1}}, {ep: a, tier: TierCPU, hashes: []uint64{1}},
				{clearTier: true, ep: a, tier: TierGPU}, {ep: a, hashes: []uint64{1}},
				{remove: true, ep: a, hashes: []uint64{1}},
			},
			prompt:  []uint64{1},
			cands:   []string{a},
			want:    []float64{WeightCPU},
			matched: 1,
		},
		{
			name: "clearing an endpoint forgets its copies",
			ops: []op{
				{ep: a, hashes: []uint64{1}}, {ep: a, hashes: []uint64{1}}, {clear: true, ep: a},
				{ep: a, hashes: []uint64{1}}, {remove: true, ep: a, hashes: []uint64{1}},
			},
			prompt:  []uint64{1},
			cands:   []string{a},
			want:    []float64{0},
			matched: 0,
		},
		{
			name: "remove",
			ops: []op{
				{ep: a, hashes: []uint64{1, 2, 3}}, {ep: b, hashes: []uint64{1, 2, 3}},
				{remove: true, ep: a, hashes: []uint64{2}},
			},
			prompt:  []uint64{1, 2, 3},
			cands:   []string{a, b},
			want:    []float64{1, 3},
			matched: 3,
		},
		{
			name:    "remove of unknown endpoint or block is a no-op",
			ops:     []op{{ep: a, hashes: []uint64{1}}, {remove: true, ep: b, hashes: []uint64{1}}, {remove: true, ep: a, hashes: []uint64{9}}},
			prompt:  []uint64{1},
			cands:   []string{a},
			want:    []float64{1},
			matched: 1,
		},
		{
			name:    "clear endpoint",
			ops:     []op{{ep: a, hashes: []uint64{1, 2}}, {ep: b, hashes: []uint64{1}}, {clear: true, ep: a}},
			prompt:  []uint64{1, 2},
			cands:   []string{a, b},
			want:    []float64{0, 1},
			matched: 1,
		},
		{
			name:    "cleared endpoint can come back",
			ops:     []op{{ep: a, hashes: []uint64{1}}, {clear: true, ep: a}, {ep: a, hashes: []uint64{1, 2}}},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{2},
			matched: 2,
		},
		{
			name:    "duplicate candidate scores once",
			ops:     []op{{ep: a, hashes: []uint64{1}}},
			prompt:  []uint64{1},
			cands:   []string{a, a},
			want:    []float64{1, 0},
			matched: 1,
		},
		{
			name:    "non-candidates do not count",
			ops:     []op{{ep: c, hashes: []uint64{1, 2}}},
			prompt:  []uint64{1, 2},
			cands:   []string{a},
			want:    []float64{0},
			matched: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx := New(Config{MaxEntries: 1000, Shards: 4})
			apply(t, idx, tt.ops)
			out := make([]float64, len(tt.cands))
			matched := idx.Lookup(tt.prompt, tt.cands, out)
			if fmt.Sprint(out) != fmt.Sprint(tt.want) || matched != tt.matched {
				t.Fatalf("Lookup = %v, %d; want %v, %d", out, matched, tt.want, tt.matched)
			}
		})
	}
}

func apply(t *testing.T, idx *Index, ops []op) {
	t.Helper()
	for _, o := range ops {
		switch {
		case o.clear:
			idx.ClearEndpoint(o.ep)
		case o.clearTier:
			idx.ClearTier(o.ep, o.tier)
		case o.remove:
			idx.Remove(o.ep, o.tier, o.hashes)
		default:
			if err := idx.Add(o.ep, o.tier, o.hashes); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestTierFromMedium(t *testing.T) {
	// vLLM's block pool sends "GPU" (older versions nothing); every other
	// medium is an offload tier, named by its offloading spec (CPU, a
	// storage tier).
	for medium, want := range map[string]Tier{
		"GPU": TierGPU, "gpu": TierGPU, "": TierGPU, "CPU": TierCPU, "cpu": TierCPU, "STORAGE": TierCPU, "disk": TierCPU,
	} {
		if got := TierFromMedium(medium); got != want {
			t.Errorf("TierFromMedium(%q) = %v, want %v", medium, got, want)
		}
	}
}

// TestManyEndpointsPerBlock covers the spill past the inline entries: adds,
// lookups, removals in any order and a sweep.
func TestManyEndpointsPerBlock(t *testing.T) {
	idx := New(Config{MaxEntries: 10000, Shards: 1})
	const n = 40
	eps := make([]string, n)
	for i := range eps {
		eps[i] = fmt.Sprintf("10.0.1.%d:8000", i)
		if err := idx.Add(eps[i], TierGPU, []uint64{7, 8}); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]float64, n)
	idx.Lookup([]uint64{7, 8}, eps, out)
	for i, v := range out {
		if v != 2 {
			t.Fatalf("endpoint %d scored %v, want 2", i, v)
		}
	}
	// Remove from the middle of the inline part and of the spill.
	for _, i := range []int{3, 20, 0, 39} {
		idx.Remove(eps[i], TierGPU, []uint64{8})
	}
	idx.ClearEndpoint(eps[10])
	idx.Lookup([]uint64{7, 8}, eps, out)
	for i, v := range out {
		want := 2.0
		switch i {
		case 3, 20, 0, 39:
			want = 1
		case 10:
			want = 0
		}
		if v != want {
			t.Fatalf("endpoint %d scored %v, want %v", i, v, want)
		}
	}
	if st := idx.Stats(); st.Entries != 2*n-4-2 || st.Blocks != 2 {
		t.Fatalf("stats = %+v", st)
	}
	for _, ep := range eps {
		idx.ClearEndpoint(ep)
	}
	if st := idx.Stats(); st.Entries != 0 || st.Blocks != 0 || st.Endpoints != 0 {
		t.Fatalf("after clearing all: %+v", st)
	}
}

func TestBoundEvictsUnreferencedBlocks(t *testing.T) {
	idx := New(Config{MaxEntries: 100, Shards: 1})
	add := func(ep string, hs ...uint64) {
		t.Helper()
		if err := idx.Add(ep, TierGPU, hs); err != nil {
			t.Fatal(err)
		}
	}
	for h := uint64(1); h <= 100; h++ {
		add("a:1", h)
	}
	// The first overflow finds every block referenced: the hand clears
	// them all in one turn and evicts one.
	add("a:1", 101)
	if st := idx.Stats(); st.Entries != 100 || st.Evictions != 1 {
		t.Fatalf("stats = %+v, want 100 entries and 1 eviction", st)
	}
	// Re-store every block but one: that one is the next to go.
	out := make([]float64, 1)
	var victim uint64
	for h := uint64(1); h <= 101; h++ {
		idx.Lookup([]uint64{h}, []string{"a:1"}, out)
		if out[0] == 0 {
			continue
		}
		if victim == 0 {
			victim = h
			continue
		}
		add("a:1", h)
	}
	add("a:1", 102)
	idx.Lookup([]uint64{victim}, []string{"a:1"}, out)
	if out[0] != 0 {
		t.Fatalf("block %d, the only unreferenced one, survived", victim)
	}
	if st := idx.Stats(); st.Entries != 100 || st.Evictions != 2 {
		t.Fatalf("stats = %+v, want 100 entries and 2 evictions", st)
	}
	for h := uint64(1000); h < 5000; h++ {
		add("b:1", h)
		if st := idx.Stats(); st.Entries > 100 {
			t.Fatalf("index holds %d entries, bound 100", st.Entries)
		}
	}
}

func TestEndpointIDsAreRecycled(t *testing.T) {
	idx := New(Config{MaxEntries: 100, Shards: 2})
	for i := range MaxEndpoints + 10 {
		ep := fmt.Sprintf("ep-%d", i)
		if err := idx.Add(ep, TierGPU, []uint64{uint64(i)}); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
		idx.ClearEndpoint(ep)
	}
	for i := range MaxEndpoints {
		if err := idx.Add(fmt.Sprintf("live-%d", i), TierGPU, nil); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
	}
	if err := idx.Add("one-too-many", TierGPU, nil); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("err = %v, want ErrTooManyEndpoints", err)
	}
}

// TestTableGrowthAndDeletion checks the open-addressing table against a map
// through growth and backward-shift deletions.
func TestTableGrowthAndDeletion(t *testing.T) {
	idx := New(Config{MaxEntries: 1 << 20, Shards: 1})
	want := map[uint64]bool{}
	for i := uint64(0); i < 20000; i++ {
		h := i * 2654435761 % 50000
		if i%3 == 2 {
			idx.Remove("a:1", TierGPU, []uint64{h})
			delete(want, h)
			continue
		}
		if err := idx.Add("a:1", TierGPU, []uint64{h}); err != nil {
			t.Fatal(err)
		}
		want[h] = true
	}
	out := make([]float64, 1)
	for h := uint64(0); h < 50000; h += 7 {
		idx.Lookup([]uint64{h}, []string{"a:1"}, out)
		if (out[0] == 1) != want[h] {
			t.Fatalf("block %d: score %v, present %v", h, out[0], want[h])
		}
	}
	if st := idx.Stats(); st.Entries != int64(len(want)) || st.Blocks != int64(len(want)) {
		t.Fatalf("stats %+v, want %d", st, len(want))
	}
	// The sweep deletes while records shift back into the holes.
	if err := idx.Add("b:1", TierGPU, []uint64{7, 8}); err != nil {
		t.Fatal(err)
	}
	idx.ClearEndpoint("a:1")
	if st := idx.Stats(); st.Entries != 2 || st.Blocks != 2 {
		t.Fatalf("after clearing a:1: %+v, want b:1's 2 entries", st)
	}
}

func TestConcurrentReadersAndWriters(t *testing.T) {
	idx := New(Config{MaxEntries: 5000, Shards: 8})
	eps := []string{"a:1", "b:1", "c:1", "d:1"}
	var wg sync.WaitGroup
	for w, ep := range eps {
		wg.Go(func() {
			for i := range 2000 {
				hs := []uint64{uint64(i % 50), uint64(i%50 + 1), uint64(i)}
				switch i % 7 {
				case 5:
					idx.Remove(ep, Tier(w%2), hs)
				case 6:
					if i%140 == 6 {
						idx.ClearEndpoint(ep)
					}
				default:
					if err := idx.Add(ep, Tier(w%2), hs); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			out := make([]float64, len(eps))
			prompt := []uint64{0, 1, 2, 3, 4, 5}
			for range 2000 {
				idx.Lookup(prompt, eps, out)
				_ = idx.Stats()
			}
		})
	}
	wg.Wait()
	if st := idx.Stats(); st.Entries > 5000 {
		t.Fatalf("entries %d over bound", st.Entries)
	}
}

// TestMemoryPerEntry measures heap bytes per (block, endpoint) entry on one
// million entries, in the two shapes that bracket real clusters: every block
// on one endpoint, and blocks shared by four.
func TestMemoryPerEntry(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocates ~100 MB; the race detector distorts heap sizes")
	}
	const entries = 1 << 20
	for _, perBlock := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d endpoints per block", perBlock), func(t *testing.T) {
			before := heapInUse()
			idx := New(Config{MaxEntries: entries, Shards: 64})
			hashes := make([]uint64, entries/perBlock)
			for i := range hashes {
				hashes[i] = mix64(uint64(i) + 1)
			}
			for e := range perBlock {
				if err := idx.Add(fmt.Sprintf("10.0.0.%d:8000", e), TierGPU, hashes); err != nil {
					t.Fatal(err)
				}
			}
			perEntry := float64(heapInUse()-before) / entries
			st := idx.Stats()
			t.Logf("%.1f heap bytes per entry (estimate %.1f), %d entries", perEntry, float64(st.Bytes)/float64(st.Entries), st.Entries)
			if perEntry > 64 {
				t.Errorf("%.1f bytes per entry, want <= 64", perEntry)
			}
			runtime.KeepAlive(idx)
		})
	}
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

func TestLookupRuns(t *testing.T) {
	idx := New(Config{})
	_ = idx.Add("a", TierGPU, []uint64{1, 2, 3})
	_ = idx.Add("b", TierCPU, []uint64{1, 2})
	_ = idx.Add("c", TierGPU, []uint64{2, 3})
	out := make([]float64, 4)
	runs := make([]int, 4)
	matched := idx.LookupRuns([]uint64{1, 2, 3, 4}, []string{"a", "b", "c", "unknown"}, out, runs)
	if matched != 3 {
		t.Fatalf("matched %d, want 3", matched)
	}
	wantRuns := []int{3, 2, 0, 0}
	wantOut := []float64{3, 1.6, 0, 0}
	for i := range runs {
		if runs[i] != wantRuns[i] || math.Abs(out[i]-wantOut[i]) > 1e-9 {
			t.Fatalf("runs %v out %v, want %v %v", runs, out, wantRuns, wantOut)
		}
	}
}

// TestLookupDuringIDReuse: an endpoint's id freed and handed to another
// endpoint while a lookup walks (or after its candidates were resolved)
// must not make the lookup score the other endpoint's blocks for the
// first. (A stress test: the interleaving it
// needs is narrow, so it runs many rounds.)
func TestLookupDuringIDReuse(t *testing.T) {
	idx := New(Config{MaxEntries: 1 << 12, Shards: 1})
	// Many blocks make the walk long and the window wide.
	onlyB := make([]uint64, 256)
	for i := range onlyB {
		onlyB[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := idx.Add("a", TierGPU, []uint64{7}); err != nil {
				t.Error(err)
				return
			}
			idx.ClearEndpoint("a")
			if err := idx.Add("b", TierGPU, onlyB); err != nil {
				t.Error(err)
				return
			}
			idx.ClearEndpoint("b")
		}
	}()
	out, runs := make([]float64, 1), make([]int, 1)
	// Candidates resolved once, as the precise scorer keeps them: their
	// ids go stale under the loop and must be resolved again.
	var resolved Candidates
	idx.Resolve(&resolved, []string{"a"})
	deadline := time.Now().Add(time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		if n%2 == 0 {
			idx.Lookup(onlyB, []string{"a"}, out)
		} else {
			idx.LookupCandidates(onlyB, &resolved, out, runs)
		}
		if out[0] != 0 {
			close(stop)
			<-done
			t.Fatalf("lookup %d scored endpoint a %v on blocks only b ever held", n, out[0])
		}
	}
	close(stop)
	<-done
}

// TestEvictionForgetsCopies: a block evicted by the bound goes with all its
// copies, so storing it again later counts from one.
func TestEvictionForgetsCopies(t *testing.T) {
	idx := New(Config{MaxEntries: 4, Shards: 1})
	add := func(hs ...uint64) {
		t.Helper()
		if err := idx.Add("a:1", TierGPU, hs); err != nil {
			t.Fatal(err)
		}
	}
	holds := func(h uint64) bool {
		out := make([]float64, 1)
		idx.Lookup([]uint64{h}, []string{"a:1"}, out)
		return out[0] != 0
	}
	add(1, 1)
	last := uint64(1)
	for holds(1) {
		if last++; last > 100 {
			t.Fatal("block 1 never evicted")
		}
		add(last)
	}
	// Make room, so that storing block 1 again evicts nothing.
	idx.Remove("a:1", TierGPU, []uint64{last})
	add(1)
	idx.Remove("a:1", TierGPU, []uint64{1})
	if holds(1) {
		t.Fatal("block 1, stored once since its eviction and removed once, is still held")
	}
}

// TestCopiesBounded: a shard counts copies for at most 1/16 of its entries
// bound; a copy past that is not counted, so the block goes at its first
// removal rather than the copies growing the index past its bound.
func TestCopiesBounded(t *testing.T) {
	idx := New(Config{MaxEntries: 32, Shards: 1}) // copies of 2 blocks
	for range 2 {
		if err := idx.Add("a:1", TierGPU, []uint64{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
	}
	idx.Remove("a:1", TierGPU, []uint64{1, 2, 3})
	out := make([]float64, 1)
	for h, want := range map[uint64]float64{1: 1, 2: 1, 3: 0} {
		if idx.Lookup([]uint64{h}, []string{"a:1"}, out); out[0] != want {
			t.Errorf("block %d scores %v, want %v", h, out[0], want)
		}
	}
}
