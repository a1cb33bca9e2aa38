package kvindex

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// A lookup that starts from block 0's holders (touching only candidates
// that hold blocks) gives what a walk over every candidate gives: checked
// against a plain model of who holds what, through Lookup, LookupRuns and
// resolved Candidates, including candidates resolved before endpoints got
// or lost their ids (stale), repeated and unknown candidates, both tiers,
// blocks shared by more endpoints than a record holds inline, and several
// shards, and copies of a block stored more than once.
func TestLookupCandidatesMatchesModel(t *testing.T) {
	for _, shards := range []int{1, 8} {
		rng := rand.New(rand.NewPCG(3, uint64(shards)))
		idx := New(Config{Shards: shards})
		eps := make([]string, 12)
		for i := range eps {
			eps[i] = fmt.Sprintf("10.0.0.%d:8000", i)
		}
		// held[ep][hash][tier] is how many copies the model says ep holds.
		held := map[string]map[uint64][2]int{}
		prompts := make([][]uint64, 6)
		for p := range prompts {
			for b := range 20 {
				// Prompts 0-2 share their first 5 blocks.
				v := uint64(p)<<32 | uint64(b)
				if p < 3 && b < 5 {
					v = uint64(b)
				}
				prompts[p] = append(prompts[p], mix64(v+1))
			}
		}
		stale := &Candidates{}
		idx.Resolve(stale, eps[:6])
		for round := range 400 {
			ep := eps[rng.IntN(len(eps))]
			pr := prompts[rng.IntN(len(prompts))]
			hs := pr[:rng.IntN(len(pr))+1]
			tier := Tier(rng.IntN(2))
			switch r := rng.IntN(10); {
			case r < 6:
				if err := idx.Add(ep, tier, hs); err != nil {
					t.Fatal(err)
				}
				if held[ep] == nil {
					held[ep] = map[uint64][2]int{}
				}
				for _, h := range hs {
					c := held[ep][h]
					c[tier]++
					held[ep][h] = c
				}
			case r < 9:
				idx.Remove(ep, tier, hs)
				for _, h := range hs {
					if held[ep] == nil {
						break
					}
					c := held[ep][h]
					c[tier] = max(0, c[tier]-1)
					if held[ep][h] = c; c == [2]int{} {
						delete(held[ep], h)
					}
				}
			default:
				idx.ClearEndpoint(ep)
				delete(held, ep)
			}
			cands := make([]string, 1+rng.IntN(len(eps)))
			for i := range cands {
				cands[i] = eps[rng.IntN(len(eps))]
			}
			cands[0] = "unknown:1"
			query := prompts[rng.IntN(len(prompts))]
			if rng.IntN(3) == 0 {
				query = query[:rng.IntN(len(query))]
			}
			wantOut, wantRuns, wantMatched := model(held, query, cands)
			out, runs := make([]float64, len(cands)), make([]int, len(cands))
			check := func(how string, matched int) {
				t.Helper()
				if matched != wantMatched {
					t.Fatalf("shards %d round %d %s: matched %d, want %d", shards, round, how, matched, wantMatched)
				}
				for i := range cands {
					if runs != nil && runs[i] != wantRuns[i] || math.Abs(out[i]-wantOut[i]) > 1e-9 {
						t.Fatalf("shards %d round %d %s: candidate %d (%s) run %d score %v, want %d %v", shards, round, how, i, cands[i], runs[i], out[i], wantRuns[i], wantOut[i])
					}
				}
			}
			check("LookupRuns", idx.LookupRuns(query, cands, out, runs))
			var c Candidates
			idx.Resolve(&c, cands)
			check("LookupCandidates", idx.LookupCandidates(query, &c, out, runs))
			// A set resolved rounds ago, its ids possibly changed since.
			wantOut, wantRuns, wantMatched = model(held, query, stale.names)
			out, runs = make([]float64, stale.Len()), make([]int, stale.Len())
			cands = stale.names
			check("stale LookupCandidates", idx.LookupCandidates(query, stale, out, runs))
			runs = nil
			check("Lookup", idx.Lookup(query, cands, out))
			if round%50 == 0 {
				idx.Resolve(stale, eps[rng.IntN(6):])
			}
		}
	}
}

// model is the lookup by definition: each candidate's run of leading
// blocks held in either tier, its tier-weighted score, a repeated
// candidate counted at its first position only, and the longest run.
func model(held map[string]map[uint64][2]int, hashes []uint64, cands []string) ([]float64, []int, int) {
	out, runs := make([]float64, len(cands)), make([]int, len(cands))
	seen := map[string]bool{}
	matched := 0
	for i, ep := range cands {
		if seen[ep] {
			continue
		}
		seen[ep] = true
		for _, h := range hashes {
			copies := held[ep][h]
			if copies == [2]int{} {
				break
			}
			runs[i]++
			if copies[TierGPU] > 0 {
				out[i] += WeightGPU
			} else {
				out[i] += WeightCPU
			}
		}
		matched = max(matched, runs[i])
	}
	return out, runs, matched
}
