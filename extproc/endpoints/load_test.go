package endpoints

import (
	"sync"
	"testing"
	"time"
)

func TestChargeLifecycle(t *testing.T) {
	a, b := NewEndpoint(Spec{Name: "a", Address: "10.0.0.1:8000"}), NewEndpoint(Spec{Name: "b", Address: "10.0.0.2:8000"})
	type want struct {
		ep                       *Endpoint
		prefillReqs, prefillToks int64
		decodeReqs, decodeToks   int64
		inflight, inflightToks   int64
	}
	check := func(t *testing.T, step string, w want) {
		t.Helper()
		l := w.ep.Load()
		if l.PrefillRequests != w.prefillReqs || l.PrefillTokens != w.prefillToks || l.DecodeRequests != w.decodeReqs || l.DecodeTokens != w.decodeToks ||
			w.ep.InflightRequests() != w.inflight || w.ep.InflightTokens() != w.inflightToks {
			t.Fatalf("%s: %s load %+v, in flight %d/%d; want %+v", step, w.ep.Name(), l, w.ep.InflightRequests(), w.ep.InflightTokens(), w)
		}
	}
	c := a.Charge(100, 300, 600, 650)
	check(t, "charged", want{ep: a, prefillReqs: 1, prefillToks: 300, inflight: 1, inflightToks: 650})
	if got, want := a.Load().PrefillAttention, AttentionPairs(100, 300); got != want || want != 300*100+300*301/2 {
		t.Fatalf("attention %d, want %d", got, want)
	}
	c.Move(b) // the proxy served a fallback
	check(t, "moved (a)", want{ep: a})
	check(t, "moved (b)", want{ep: b, prefillReqs: 1, prefillToks: 300, inflight: 1, inflightToks: 650})
	c.FirstToken()
	c.FirstToken() // idempotent
	check(t, "first token", want{ep: b, decodeReqs: 1, decodeToks: 600, inflight: 1, inflightToks: 650})
	c.Release()
	c.Release()
	c.Move(a) // a released charge charges nothing anywhere
	check(t, "released (b)", want{ep: b})
	check(t, "released (a)", want{ep: a})
	if l := b.Load(); l.PrefillAttention != 0 {
		t.Fatalf("attention left after release: %+v", l)
	}
	var zero Charge
	zero.FirstToken()
	zero.Release()
	zero.Move(a)
	check(t, "zero charge", want{ep: a})
}

// The class split follows the charge through every phase and a fallback,
// and the two parts always sum to the in-flight count.
func TestChargeClass(t *testing.T) {
	a, b := NewEndpoint(Spec{Name: "a", Address: "10.0.0.1:8000"}), NewEndpoint(Spec{Name: "b", Address: "10.0.0.2:8000"})
	check := func(step string, e *Endpoint, protected, sheddable int64) {
		t.Helper()
		p, n := e.InflightByClass()
		if p != protected || n != sheddable || p+n != e.InflightRequests() {
			t.Fatalf("%s: %s holds %d protected, %d sheddable (in flight %d); want %d, %d", step, e.Name(), p, n, e.InflightRequests(), protected, sheddable)
		}
	}
	online := a.Charge(0, 10, 20, 20)
	batch := a.ChargeClass(true, 0, 10, 20, 20)
	check("charged", a, 1, 1)
	batch.FirstToken()
	check("first token", a, 1, 1)
	batch.Move(b)
	check("moved (a)", a, 1, 0)
	check("moved (b)", b, 0, 1)
	batch.Release()
	batch.Release()
	online.Release()
	check("released (a)", a, 0, 0)
	check("released (b)", b, 0, 0)
}

// A scrape counts the requests the server admitted; the picker's own are
// not counted again, only traffic from elsewhere is.
func TestReconcileCountsOnlyForeignTraffic(t *testing.T) {
	tests := []struct {
		name                  string
		ownPrefill, ownDecode int
		waiting, running      int
		extWaiting, extRun    int64
	}{
		{name: "all ours", ownPrefill: 2, ownDecode: 3, waiting: 2, running: 3},
		{name: "scrape lags our decisions", ownPrefill: 4, ownDecode: 3, waiting: 1, running: 3},
		{name: "foreign waiting", ownPrefill: 1, ownDecode: 2, waiting: 4, running: 2, extWaiting: 3},
		{name: "foreign running", ownPrefill: 0, ownDecode: 2, waiting: 0, running: 7, extRun: 5},
		{name: "both", ownPrefill: 1, ownDecode: 1, waiting: 3, running: 4, extWaiting: 2, extRun: 3},
		{name: "idle picker", waiting: 5, running: 9, extWaiting: 5, extRun: 9},
		// Our prefills are running (chunked); the queue is someone else's.
		{name: "our prefills running, foreign queue", ownPrefill: 10, waiting: 10, running: 10, extWaiting: 5, extRun: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEndpoint(Spec{Name: "a", Address: "10.0.0.1:8000"})
			for range tt.ownPrefill {
				e.Charge(0, 10, 20, 20)
			}
			for range tt.ownDecode {
				c := e.Charge(0, 10, 20, 20)
				c.FirstToken()
			}
			e.SetMetrics(&Metrics{WaitingQueueSize: tt.waiting, RunningRequests: tt.running})
			l := e.Load()
			if l.ExternalWaiting != tt.extWaiting || l.ExternalRunning != tt.extRun {
				t.Errorf("external waiting/running = %d/%d, want %d/%d", l.ExternalWaiting, l.ExternalRunning, tt.extWaiting, tt.extRun)
			}
			if got, want := l.Requests(), int64(tt.ownPrefill+tt.ownDecode)+tt.extWaiting+tt.extRun; got != want {
				t.Errorf("Requests() = %d, want %d", got, want)
			}
		})
	}
}

// Token counts come from clients: a charge bounds them, so that the
// attention pairs (quadratic) cannot overflow the endpoint's sums.
func TestChargeBoundsTokens(t *testing.T) {
	e := NewEndpoint(Spec{Name: "a", Address: "10.0.0.1:8000"})
	for range 1000 {
		e.Charge(1<<40, 1<<40, 1<<40, 1)
	}
	l := e.Load()
	if l.PrefillTokens != 1000*maxChargedTokens || l.PrefillAttention <= 0 || l.PrefillAttention != 1000*AttentionPairs(maxChargedTokens, maxChargedTokens) {
		t.Fatalf("load %+v", l)
	}
	if AttentionPairs(-5, -5) != 0 {
		t.Fatal("negative counts charged")
	}
}

// A charge with a predicted finish is in the backlog until then and not
// after; moved, it leaves its old endpoint's backlog; past its first token
// or released, it is in neither Load nor the backlog.
func TestPrefillBacklogLeavesComputedCharges(t *testing.T) {
	a, b := NewEndpoint(Spec{Name: "a", Address: "10.0.0.1:8000"}), NewEndpoint(Spec{Name: "b", Address: "10.0.0.2:8000"})
	t0 := time.Unix(1e9, 0)
	other := a.Charge(0, 1000, 1000, 1000)
	defer other.Release()
	remote := a.ChargeComputedBy(false, 100, 300, 400, 400, t0.Add(time.Second))
	backlog := func(e *Endpoint, at time.Time) [2]int64 {
		tok, att := e.PrefillBacklog(at)
		return [2]int64{tok, att}
	}
	whole := [2]int64{1300, AttentionPairs(0, 1000) + AttentionPairs(100, 300)}
	rest := [2]int64{1000, AttentionPairs(0, 1000)}
	for _, c := range []struct {
		step string
		e    *Endpoint
		at   time.Time
		want [2]int64
	}{
		{"before its finish", a, t0, whole},
		{"at its finish", a, t0.Add(time.Second), rest},
		{"after", a, t0.Add(time.Hour), rest},
	} {
		if got := backlog(c.e, c.at); got != c.want {
			t.Errorf("%s: backlog %v, want %v", c.step, got, c.want)
		}
	}
	if l := a.Load(); l.PrefillTokens != whole[0] {
		t.Errorf("Load's prefill tokens %d, want the whole %d", l.PrefillTokens, whole[0])
	}
	remote.Move(b)
	if got := backlog(a, t0); got != rest {
		t.Errorf("moved: old endpoint's backlog %v, want %v", got, rest)
	}
	if got := backlog(b, t0.Add(time.Hour)); got != [2]int64{} {
		t.Errorf("moved: new endpoint's backlog past the finish %v, want none", got)
	}
	remote.FirstToken()
	if got := backlog(b, t0); got != [2]int64{} {
		t.Errorf("past its first token: backlog %v, want none", got)
	}
	remote.Release()
	if got := backlog(a, t0.Add(time.Hour)); got != rest {
		t.Errorf("released: backlog %v, want %v", got, rest)
	}
}

// A charge past its predicted finish released while decisions read the
// backlog is subtracted from both the counters and the computed set or
// from neither: the backlog never drops below the work that is not
// computed (a reader of two separately released accounts could subtract
// a finished prefill twice).
func TestPrefillBacklogConsistentWithRelease(t *testing.T) {
	e := NewEndpoint(Spec{Name: "p", Address: "10.0.0.1:8000"})
	t0 := time.Unix(1e9, 0)
	queued := e.Charge(0, 4000, 4000, 4000)
	defer queued.Release()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := e.ChargeComputedBy(false, 0, 8000, 8000, 8000, t0)
			c.Release()
		}
	})
	for range 20000 {
		if tokens, _ := e.PrefillBacklog(t0); tokens != 4000 {
			close(stop)
			wg.Wait()
			t.Fatalf("backlog %d tokens, want the 4000 not computed", tokens)
		}
	}
	close(stop)
	wg.Wait()
}
