package latency

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// TestCandidatesPredictLikeAddresses: predictions through a decision's
// candidate index are those by address, while fits are added and
// forgotten and the candidate list changes (a copy, a subset, a reorder).
func TestCandidatesPredictLikeAddresses(t *testing.T) {
	m := New(Config{MinSamples: 2})
	eps := make([]*endpoints.Endpoint, 8)
	for i := range eps {
		eps[i] = endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint("e", i), Address: fmt.Sprintf("10.0.0.%d:8000", i)})
	}
	now := time.Unix(1_700_000_000, 0)
	lists := [][]*endpoints.Endpoint{eps, append([]*endpoints.Endpoint(nil), eps...), eps[2:6], {eps[3], eps[1], eps[7]}}
	indexed := 0
	for round := range 400 {
		list := lists[(round/50)%len(lists)]
		if round < 60 && round%7 == 0 { // a new fit: the endpoint map changes
			e := eps[round%len(eps)]
			for k := range 3 {
				m.ObserveTTFT(e.Address(), Features{Prefill: float64(100 * (k + 1 + round%5))}, time.Duration(10+k+round%3)*time.Millisecond)
			}
		}
		if round == 210 || round == 330 {
			m.Forget(eps[round%len(eps)].Address())
		}
		c := m.Candidates(list)
		if c.idx != nil {
			indexed++
		}
		for i, e := range list {
			f := Features{Prefill: float64(50 * (i + 1)), Decodes: float64(i)}
			g := f
			got := c.PredictLive(i, e, &f, now, Engine{External: 1})
			want := m.PredictLive(e.Address(), &g, now, Engine{External: 1})
			if got != want {
				t.Fatalf("round %d, %s: indexed %+v, by address %+v", round, e.Address(), got, want)
			}
		}
	}
	if indexed < 200 {
		t.Fatalf("only %d of 400 decisions used the index", indexed)
	}
}

// TestCandidatesIndexBacksOff: decisions whose lists alternate rebuild the
// index (an allocation each) rarely, and a list that stays is indexed
// again within maxReindexWait decisions.
func TestCandidatesIndexBacksOff(t *testing.T) {
	m := New(Config{})
	a := []*endpoints.Endpoint{endpoints.NewEndpoint(endpoints.Spec{Address: "10.0.0.1:8000"})}
	b := []*endpoints.Endpoint{endpoints.NewEndpoint(endpoints.Spec{Address: "10.0.0.2:8000"})}
	rebuilds := 0
	var last *fitIndex
	const rounds = 20 * maxReindexWait
	for i := range rounds {
		list := a
		if i%2 == 1 {
			list = b
		}
		if c := m.Candidates(list); c.idx != nil && c.idx != last {
			rebuilds++
			last = c.idx
		}
	}
	t.Logf("%d rebuilds in %d alternating decisions", rebuilds, rounds)
	if rebuilds > rounds/16 {
		t.Fatalf("%d rebuilds in %d alternating decisions", rebuilds, rounds)
	}
	for range maxReindexWait {
		m.Candidates(a)
	}
	for range 3 {
		if m.Candidates(a).idx == nil {
			t.Fatal("a steady list is not indexed")
		}
	}
}

// TestDeferredTPOT: TPOT computed on demand (one candidate's, or every
// candidate's) is PredictLive's, zero where noTPOT says so, and the TTFT
// computed without it is PredictLive's too.
func TestDeferredTPOT(t *testing.T) {
	m := New(Config{MinSamples: 2})
	eps := make([]*endpoints.Endpoint, 6)
	for i := range eps {
		eps[i] = endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint("e", i), Address: fmt.Sprintf("10.0.0.%d:8000", i)})
	}
	for i, e := range eps[:4] { // two endpoints keep the pool's fit
		for k := range 4 {
			m.ObserveTPOT(e.Address(), Features{Decodes: float64(k + 1), DecodeTokens: 1000}, time.Duration(8+i+k)*time.Millisecond)
			m.ObserveTTFT(e.Address(), Features{Prefill: float64(100 * (k + 1))}, time.Duration(20+i+k)*time.Millisecond)
		}
	}
	now := time.Unix(1_700_000_000, 0)
	noTPOT := func(e *endpoints.Endpoint) bool { return e == eps[1] }
	for _, skip := range []func(*endpoints.Endpoint) bool{nil, noTPOT} {
		for _, all := range []bool{false, true} {
			var p Predictions
			p.Reset(eps)
			c := m.Candidates(eps)
			want := make([]Estimate, len(eps))
			for i, e := range eps {
				p.Features[i] = Features{Prefill: float64(50 * (i + 1)), Decodes: float64(i), DecodeTokens: float64(300 * i)}
				eng := Engine{External: float64(i % 2)}
				c.PredictTTFT(i, e, &p.Features[i], now.UnixNano(), &eng, &p.Estimates[i])
				f := p.Features[i]
				want[i] = m.PredictLive(e.Address(), &f, now, eng)
				if skip != nil && skip(e) {
					want[i].TPOT, want[i].TPOTQuantile = 0, 0
				}
				if p.Estimates[i].TTFT != want[i].TTFT || p.Estimates[i].TTFTQuantile != want[i].TTFTQuantile || p.Estimates[i].TPOT != 0 {
					t.Fatalf("%s: PredictTTFT %+v, PredictLive %+v", e.Name(), p.Estimates[i], want[i])
				}
			}
			p.DeferTPOT(c, skip)
			if all {
				p.FillTPOT()
			}
			for i := range eps {
				if got := p.Estimate(i); got != want[i] || (all && p.Estimates[i] != want[i]) {
					t.Fatalf("skip %v, all %v, %s: deferred %+v, PredictLive %+v", skip != nil, all, eps[i].Name(), got, want[i])
				}
				if want[i].TPOT == 0 && (skip == nil || !skip(eps[i])) {
					t.Fatalf("%s: TPOT not learned: %+v", eps[i].Name(), want[i])
				}
			}
		}
	}
}
