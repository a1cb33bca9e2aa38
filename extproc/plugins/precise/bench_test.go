package precise

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// BenchmarkProduce is the precise match of one decision as
// extproc/config's BenchmarkPick makes it: 256 candidates, prompts of 502
// token ids (31 full blocks) from 32 shared system prompts, speculative
// indexing on. The index states:
//   - empty: no KV events, nothing speculated (what BenchmarkPick's precise
//     profile sees: its requests complete before the next is decided);
//   - held: KV events put each system prompt on 8 endpoints' GPU caches and
//     its first half on 8 more's CPU tiers;
//   - speculative: held, and 512 requests in flight (routed round-robin,
//     not yet complete), so every endpoint has prompts pending.
//
// Each iteration is one request's Produce and PreRequest; its state is
// recycled when it leaves the in-flight window (at once when there is
// none). cpu-ns/op is the benchmark thread's CPU time per iteration: on a
// shared machine the wall-clock figure counts other processes' time too.
func BenchmarkProduce(b *testing.B) {
	for _, bc := range []struct {
		name     string
		held     bool
		inflight int
	}{
		{"empty", false, 0},
		{"held", true, 0},
		{"speculative", true, 512},
	} {
		b.Run(bc.name, func(b *testing.B) {
			idx := kvindex.New(kvindex.Config{})
			s := build(b, idx, `{"speculativeIndexing": true}`)
			eps := make([]*endpoints.Endpoint, 256)
			for i := range eps {
				eps[i] = schedtest.Endpoint(fmt.Sprintf("pod-%04d", i), endpoints.Metrics{})
			}
			reqs := benchRequests(b, 256)
			if bc.held {
				for sys := range 32 {
					hashes := s.Hashes(reqs[sys].Body.PromptTokenIDs, "", "")
					for k := range 8 {
						mustAdd(b, idx, eps[(sys*8+k)%len(eps)].Address(), kvindex.TierGPU, hashes)
						mustAdd(b, idx, eps[(sys*8+k+128)%len(eps)].Address(), kvindex.TierCPU, hashes[:len(hashes)/2])
					}
				}
			}
			ring := make([]*scheduling.CycleState, max(bc.inflight, 1))
			res := &scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: make([]*endpoints.Endpoint, 1)}}}
			decide := func(i int) {
				cs := scheduling.AcquireCycleState()
				r := reqs[i%len(reqs)]
				s.Produce(context.Background(), cs, r, eps)
				res.Profiles["p"].Targets[0] = eps[i%len(eps)]
				s.PreRequest(context.Background(), cs, r, res)
				k := i % len(ring)
				if old := ring[k]; old != nil {
					old.Release()
				}
				ring[k] = cs
				if bc.inflight == 0 {
					cs.Release()
					ring[k] = nil
				}
			}
			for i := range 2 * len(ring) { // warm the caches and the window
				decide(i)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			c0, ok := testutil.ThreadCPU()
			for i := range b.N {
				decide(i)
			}
			if c1, _ := testutil.ThreadCPU(); ok {
				b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			}
			b.StopTimer()
			for _, cs := range ring {
				if cs != nil {
					cs.Release()
				}
			}
		})
	}
}

// benchRequests are BenchmarkPick's precise prompts: 500 token ids of one
// of 32 system prompts, then two of the request's own.
func benchRequests(tb testing.TB, n int) []*scheduling.Request {
	reqs := make([]*scheduling.Request, n)
	for i := range reqs {
		ids := make([]int, 0, 502)
		for j := range 500 {
			ids = append(ids, 1000+(i%32)*500+j)
		}
		ids = append(ids, 90000+i, 90001+i)
		js, _ := json.Marshal(ids)
		reqs[i] = completion(tb, fmt.Sprintf(`{"model":"m","prompt":%s,"stream":true}`, js))
	}
	return reqs
}

func mustAdd(tb testing.TB, idx *kvindex.Index, ep string, tier kvindex.Tier, hashes []uint64) {
	if err := idx.Add(ep, tier, hashes); err != nil {
		tb.Fatal(err)
	}
}
