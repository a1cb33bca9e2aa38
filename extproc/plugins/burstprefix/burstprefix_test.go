package burstprefix

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/prefix"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

func fleet(n int) []*endpoints.Endpoint {
	var eps []*endpoints.Endpoint
	for i := range n {
		eps = append(eps, endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprintf("r%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1)}))
	}
	return eps
}

// prompt is a completions request of blocks 64-token (256-byte) blocks:
// shared leading blocks of base, then the rest unique to tail.
func prompt(t *testing.T, base string, shared, blocks int, tail string) *scheduling.Request {
	t.Helper()
	var b strings.Builder
	for i := range blocks {
		src := base
		if i >= shared {
			src = tail
		}
		b.WriteString(fmt.Sprintf("%-256s", fmt.Sprintf("%s block %d", src, i)))
	}
	body, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"`+b.String()+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	return &scheduling.Request{Body: body}
}

// burst runs reqs through one window of p over eps and returns the
// replica each was placed on ("" for none).
func burst(t *testing.T, p *Producer, eps []*endpoints.Endpoint, reqs []*scheduling.Request) []string {
	t.Helper()
	out := make([]string, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			cs := scheduling.NewCycleState()
			p.Produce(context.Background(), cs, r, eps)
			if m, ok := p.MatchOf(cs); ok && m.Blocks > 0 {
				for k, e := range m.Prediction.Candidates() {
					if m.Prediction.HeldBlocks(k) == float64(m.Blocks) {
						out[i] = e.Name()
					}
				}
			}
		})
	}
	// Close the window once every request joined it, rather than racing
	// a timer.
	for {
		p.mu.Lock()
		w := p.open
		n := 0
		if w != nil {
			n = len(w.entries)
		}
		p.mu.Unlock()
		if n == len(reqs) || (p.batchSize != unlimited && n == p.batchSize) {
			p.seal(w)
			break
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	return out
}

func producer(t *testing.T, params string) *Producer {
	t.Helper()
	p, err := New("burst", []byte(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Producer)
}

// summary is the requests per replica, most first, and how many were not
// placed: arrival order within a window is not fixed, so which member of
// a unit lands where is not either.
func summary(got []string) string {
	per := map[string]int{}
	none := 0
	for _, g := range got {
		if g == "" {
			none++
		} else {
			per[g]++
		}
	}
	var counts []int
	for _, n := range per {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	slices.Reverse(counts)
	return fmt.Sprintf("%v unplaced %d", counts, none)
}

func TestPlacement(t *testing.T) {
	type req struct {
		base          string
		shared, total int
		tail          string
	}
	same := func(base string, n int) []req {
		var out []req
		for range n {
			out = append(out, req{base, 4, 4, ""})
		}
		return out
	}
	sharing := func(n int) []req {
		var out []req
		for i := range n {
			out = append(out, req{"sys", 2, 4, fmt.Sprintf("user %d", i)})
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		params   string
		replicas int
		reqs     []req
		want     string
		// together are index ranges [from, to) that must share a replica.
		together [][2]int
	}{
		{name: "identical groups co-locate, a lone prompt is left alone", replicas: 3,
			reqs: append(append(same("A", 4), same("B", 3)...), req{"C", 4, 4, ""}),
			want: "[4 3] unplaced 1", together: [][2]int{{0, 4}, {4, 7}}},
		{name: "maxPerReplica spills a group", params: `,"maxPerReplica":2`, replicas: 3,
			reqs: same("A", 5), want: "[2 2 1] unplaced 0"},
		{name: "prompts sharing only a preamble stay unplaced by default", replicas: 2,
			reqs: sharing(4), want: "[] unplaced 4"},
		{name: "minColocateBlocks pairs them up to the fair share", params: `,"minColocateBlocks":2`, replicas: 2,
			reqs: append(sharing(4), req{"other", 4, 4, ""}), want: "[2 2] unplaced 1"},
		{name: "fair share bounds the prefix preference", params: `,"minColocateBlocks":2`, replicas: 3,
			reqs: sharing(6), want: "[2 2 2] unplaced 0"},
		{name: "a preamble shorter than minColocateBlocks places nothing", params: `,"minColocateBlocks":3`, replicas: 2,
			reqs: sharing(4), want: "[] unplaced 4"},
		{name: "maxBatchSize leaves the overflow unplaced", params: `,"maxBatchSize":2`, replicas: 3,
			reqs: same("A", 3), want: "[2] unplaced 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := producer(t, `{"windowDurationMs":10000`+tc.params+`}`)
			var reqs []*scheduling.Request
			for _, r := range tc.reqs {
				reqs = append(reqs, prompt(t, r.base, r.shared, r.total, r.tail))
			}
			got := burst(t, p, fleet(tc.replicas), reqs)
			if s := summary(got); s != tc.want {
				t.Fatalf("placed %v: %s, want %s", got, s, tc.want)
			}
			for _, r := range tc.together {
				for i := r[0]; i < r[1]; i++ {
					if got[i] != got[r[0]] {
						t.Fatalf("placed %v: requests %d-%d split", got, r[0], r[1]-1)
					}
				}
			}
		})
	}
}

// TestBalanceByTokens: a long group and three short ones on two replicas
// balance by requests (4 and 4) or by prefix blocks (the long group alone
// on one replica, 16 blocks against 3x2).
func TestBalanceByTokens(t *testing.T) {
	mk := func(base string, blocks int) []*scheduling.Request {
		return []*scheduling.Request{prompt(t, base, blocks, blocks, ""), prompt(t, base, blocks, blocks, "")}
	}
	reqs := slices.Concat(mk("long", 16), mk("s1", 2), mk("s2", 2), mk("s3", 2))
	for balance, want := range map[string]string{"requests": "[4 4] unplaced 0", "tokens": "[6 2] unplaced 0"} {
		got := burst(t, producer(t, `{"windowDurationMs":10000,"balanceBy":"`+balance+`"}`), fleet(2), reqs)
		if s := summary(got); s != want {
			t.Errorf("balanceBy %s: placed %v: %s, want %s", balance, got, s, want)
		}
		if got[0] != got[1] {
			t.Errorf("balanceBy %s: the long group split: %v", balance, got)
		}
	}
}

// TestScorerReadsIt: prefix-cache-scorer with prefixMatchInfoProducerName
// scores the assigned replica 1 and the others 0.
func TestScorerReadsIt(t *testing.T) {
	p := producer(t, `{"windowDurationMs":10000}`)
	sp, err := prefix.New("s", []byte(`{"prefixMatchInfoProducerName":"burst"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.(scheduling.Resolver).Resolve(func(string) (scheduling.Plugin, bool) { return p, true }); err != nil {
		t.Fatal(err)
	}
	eps := fleet(3)
	reqs := []*scheduling.Request{prompt(t, "A", 4, 4, ""), prompt(t, "A", 4, 4, "")}
	css := []*scheduling.CycleState{scheduling.NewCycleState(), scheduling.NewCycleState()}
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() { p.Produce(context.Background(), css[i], reqs[i], eps) })
	}
	for {
		p.mu.Lock()
		w := p.open
		ready := w != nil && len(w.entries) == 2
		p.mu.Unlock()
		if ready {
			p.seal(w)
			break
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	scores := make([]float64, 3)
	sp.(scheduling.Scorer).Score(context.Background(), css[0], reqs[0], eps, scores)
	if scores[0] != 1 || scores[1] != 0 || scores[2] != 0 {
		t.Fatalf("scores %v", scores)
	}
}

// TestWindowTimer: a request alone waits one window and gets no placement
// (nothing shares its prompt); a cancelled wait returns at once.
func TestWindowTimer(t *testing.T) {
	p := producer(t, `{"windowDurationMs":1}`)
	cs := scheduling.NewCycleState()
	p.Produce(context.Background(), cs, prompt(t, "A", 4, 4, ""), fleet(2))
	if m, ok := p.MatchOf(cs); !ok || m.Prediction.HeldBlocks(0)+m.Prediction.HeldBlocks(1) != 0 {
		t.Fatalf("a lone request was placed: %+v %v", m, ok)
	}
	p = producer(t, `{"windowDurationMs":10000}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cs = scheduling.NewCycleState()
	p.Produce(ctx, cs, prompt(t, "A", 4, 4, ""), fleet(2))
	if _, ok := p.MatchOf(cs); ok {
		t.Fatal("a cancelled request has a match")
	}
	p.mu.Lock()
	w := p.open
	p.mu.Unlock()
	p.seal(w)
	p.seal(w) // the timer firing later is harmless
}

func TestParams(t *testing.T) {
	for params, want := range map[string]string{
		`{"windowDurationMs":0}`:                               "1-10000",
		`{"windowDurationMs":10001}`:                           "1-10000",
		`{"maxPerReplica":0}`:                                  "maxPerReplica",
		`{"blockSizeTokens":0}`:                                "blockSizeTokens",
		`{"maxPrefixTokensToMatch":16}`:                        "at least blockSizeTokens",
		`{"minColocateBlocks":-1}`:                             "minColocateBlocks",
		`{"maxBatchSize":0}`:                                   "maxBatchSize",
		`{"balanceBy":"bytes"}`:                                "balanceBy",
		`{"windowDurationMs":100,"maxPerReplica":-1,"x":true}`: "unknown field",
	} {
		if _, err := New("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
	p := producer(t, `{"maxPrefixTokensToMatch":640}`)
	if p.maxBlocks != 10 || p.window != 100*time.Millisecond || p.blockTokens != 64 || p.perReplica != unlimited || p.batchSize != 1000 {
		t.Fatalf("defaults %+v", p)
	}
}

// TestDecisionReturnsMatch: the match's per-candidate part is handed back
// at the decision (the hook the director runs on every plugin that has it)
// instead of staying with the request until its response ends.
func TestDecisionReturnsMatch(t *testing.T) {
	p := producer(t, `{"windowDurationMs":10000}`)
	eps := fleet(3)
	req := prompt(t, "A", 4, 4, "")
	cs := scheduling.NewCycleState()
	done := make(chan struct{})
	go func() { p.Produce(context.Background(), cs, req, eps); close(done) }()
	for {
		p.mu.Lock()
		w := p.open
		ready := w != nil && len(w.entries) == 1
		p.mu.Unlock()
		if ready {
			p.seal(w)
			break
		}
		time.Sleep(time.Millisecond)
	}
	<-done
	m, ok := p.MatchOf(cs)
	if !ok || len(m.Prediction.Candidates()) != len(eps) {
		t.Fatalf("no match over the candidates: %+v", m)
	}
	if h, ok := any(p).(scheduling.PreRequest); ok {
		h.PreRequest(context.Background(), cs, req, &scheduling.Result{})
	}
	if m.Prediction.Candidates() != nil {
		t.Error("the match's per-candidate part is kept past the decision")
	}
}
