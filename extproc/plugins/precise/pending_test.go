package precise

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// route scores req over eps in a fresh cycle, then records that it was
// sent to eps[target]; it returns the cycle and the scores.
func route(t *testing.T, s *Scorer, req *scheduling.Request, eps []*endpoints.Endpoint, target int) (*scheduling.CycleState, []float64) {
	t.Helper()
	cs := scheduling.NewCycleState()
	s.Produce(context.Background(), cs, req, eps)
	scores := make([]float64, len(eps))
	s.Score(context.Background(), cs, req, eps, scores)
	res := &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{eps[target]}}}}
	s.PreRequest(context.Background(), cs, req, res)
	return cs, scores
}

// With speculative indexing, a prompt routed to an endpoint counts as held
// there for the requests routed after it until its response ends (its
// blocks stay resident while it runs; the first token does not release
// them, since the KV events announcing them come later). The release
// withdraws only the speculative entries: blocks the endpoint's KV events
// stored meanwhile stay held.
func TestSpeculativeMatch(t *testing.T) {
	const prompt = `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`
	tests := []struct {
		name        string
		params      string
		release     func(s *Scorer, cs *scheduling.CycleState)
		stored      bool    // the first request's KV events reach the index while it runs
		wantDuring  float64 // score on the endpoint while the first request is in prefill
		wantRelease float64
	}{
		{name: "off", params: `{"blockSize": 4}`, release: func(*Scorer, *scheduling.CycleState) {}, wantDuring: 0, wantRelease: 0},
		{name: "kept past the first token", params: `{"blockSize": 4, "speculativeIndexing": true}`,
			release: func(*Scorer, *scheduling.CycleState) {}, wantDuring: 1, wantRelease: 1},
		{name: "released at the end", params: `{"blockSize": 4, "speculativeIndexing": true}`,
			release: func(s *Scorer, cs *scheduling.CycleState) {
				s.ResponseComplete(context.Background(), cs, nil, &scheduling.Response{})
			}, wantDuring: 1, wantRelease: 0},
		{name: "stored by KV events, then released", params: `{"blockSize": 4, "speculativeIndexing": true}`, stored: true,
			release: func(s *Scorer, cs *scheduling.CycleState) {
				s.ResponseComplete(context.Background(), cs, nil, &scheduling.Response{})
			}, wantDuring: 1, wantRelease: 1},
		{name: "bound reached", params: `{"blockSize": 4, "speculativeIndexing": true, "maxSpeculativeEntries": 2}`,
			release: func(*Scorer, *scheduling.CycleState) {}, wantDuring: 0, wantRelease: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx := kvindex.New(kvindex.Config{})
			s := build(t, idx, tt.params)
			eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
			first, cold := route(t, s, completion(t, prompt), eps, 1)
			if cold[0] != 0 || cold[1] != 0 {
				t.Fatalf("cold scores %v", cold)
			}
			_, during := route(t, s, completion(t, prompt), eps, 0)
			if during[0] != 0 || during[1] != tt.wantDuring {
				t.Fatalf("scores while in prefill %v, want [0 %v]", during, tt.wantDuring)
			}
			if tt.stored {
				if err := idx.Add(eps[1].Address(), kvindex.TierGPU, s.Hashes([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, "", "")); err != nil {
					t.Fatal(err)
				}
			}
			tt.release(s, first)
			// The second request is still pending on a: only b's entries
			// were released.
			cs := scheduling.NewCycleState()
			s.Produce(context.Background(), cs, completion(t, prompt), eps)
			after := make([]float64, 2)
			s.Score(context.Background(), cs, completion(t, prompt), eps, after)
			if after[1] != tt.wantRelease || after[0] != tt.wantDuring {
				t.Fatalf("scores after release %v, want [%v %v]", after, tt.wantDuring, tt.wantRelease)
			}
			s.EndpointsRemoved([]string{eps[0].Address()})
			s.Score(context.Background(), scheduling.NewCycleState(), completion(t, prompt), eps, after)
			if after[0] != 0 {
				t.Fatalf("removed endpoint still holds pending blocks: %v", after)
			}
		})
	}
}

// refPending is the speculative set by definition: per endpoint, how many
// routed requests hold each sample hash; a candidate's run is its leading
// hashes held. The roots pending reads through must give the same runs.
type refPending map[string]map[uint64]int32

func (r refPending) extend(names []string, hashes []uint64, runs []int, weights []float64) {
	for i, a := range names {
		n := 0
		for n < len(hashes) && r[a][hashes[n]] > 0 {
			n++
		}
		if n > runs[i] {
			weights[i] += float64(n - runs[i])
			runs[i] = n
		}
	}
}

// Runs through roots equal the definition's over random traffic: requests
// of prompts sharing prefixes added, removed and forgotten endpoints,
// candidates repeated or unknown, resolved before the ids changed (stale)
// or now, with and without interning, from runs the index already set.
func TestPendingMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	p := newPending(1 << 20)
	ref := refPending{}
	addrs := []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1"}
	// Prompts of three families (their block 0) diverging at random blocks.
	prompt := func() []uint64 {
		fam, split, n := uint64(rng.IntN(3)), rng.IntN(6), 1+rng.IntN(10)
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = fam<<40 | uint64(i)
			if i >= split {
				hs[i] |= uint64(split+1) << 20
			}
		}
		return hs
	}
	type routed struct {
		addr   string
		hashes []uint64
	}
	var inflight []routed
	var stale pendingCandidates
	staleNames := addrs[:4]
	p.resolve(&stale, staleNames, false)
	// An endpoint given its first entries after the candidates were
	// resolved is found: they are stale.
	if !p.add("b:1", []uint64{7, 8}) {
		t.Fatal("add refused")
	}
	runs, weights := make([]int, 4), make([]float64, 4)
	p.extend(&stale, staleNames, &pendingCandidates{}, []uint64{7, 8, 9}, runs, weights)
	if !slices.Equal(runs, []int{0, 2, 0, 0}) {
		t.Fatalf("runs %v over candidates resolved before b had entries", runs)
	}
	p.remove("b:1", []uint64{7, 8})
	for round := range 2000 {
		switch r := rng.IntN(10); {
		case r < 5:
			a, hs := addrs[rng.IntN(len(addrs))], prompt()
			if p.add(a, hs) {
				inflight = append(inflight, routed{a, hs})
				if ref[a] == nil {
					ref[a] = map[uint64]int32{}
				}
				for _, h := range hs {
					ref[a][h]++
				}
			}
		case r < 9 && len(inflight) > 0:
			k := rng.IntN(len(inflight))
			q := inflight[k]
			inflight = append(inflight[:k], inflight[k+1:]...)
			p.remove(q.addr, q.hashes)
			for _, h := range q.hashes {
				if ref[q.addr][h] <= 1 {
					delete(ref[q.addr], h)
				} else {
					ref[q.addr][h]--
				}
			}
		case r == 9:
			a := addrs[rng.IntN(len(addrs))]
			p.forget(a)
			delete(ref, a)
			// A request still in flight there no longer holds anything.
			inflight = slices.DeleteFunc(inflight, func(q routed) bool { return q.addr == a })
		}
		names := make([]string, 1+rng.IntN(8))
		for i := range names {
			names[i] = addrs[rng.IntN(len(addrs))]
		}
		names[0] = "unknown:1"
		hs := prompt()
		for _, how := range []string{"resolved", "interned", "stale"} {
			var c pendingCandidates
			ns := names
			switch how {
			case "resolved":
				p.resolve(&c, ns, false)
			case "interned":
				p.resolve(&c, ns, true)
			default:
				c, ns = stale, staleNames
			}
			runs, weights := make([]int, len(ns)), make([]float64, len(ns))
			for i := range runs { // what the index found
				runs[i] = rng.IntN(3)
				weights[i] = float64(runs[i]) * 0.8
			}
			wantRuns, wantWeights := slices.Clone(runs), slices.Clone(weights)
			ref.extend(ns, hs, wantRuns, wantWeights)
			var scratch pendingCandidates
			p.extend(&c, ns, &scratch, hs, runs, weights)
			if !slices.Equal(runs, wantRuns) || !slices.Equal(weights, wantWeights) {
				t.Fatalf("round %d, %s candidates %v, prompt %x: runs %v weights %v, want %v %v", round, how, ns, hs, runs, weights, wantRuns, wantWeights)
			}
		}
		if round%100 == 0 {
			staleNames = addrs[rng.IntN(3):]
			p.resolve(&stale, staleNames, rng.IntN(2) == 0)
		}
	}
	if p.entries < 0 {
		t.Fatalf("entries %d", p.entries)
	}
}
