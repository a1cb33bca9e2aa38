package flowcontrol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// pool is a settable endpoint list.
type pool struct {
	mu  sync.Mutex
	eps []*endpoints.Endpoint
}

func (p *pool) Candidates() []*endpoints.Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.eps
}

func (p *pool) set(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eps = nil
	for i := range n {
		p.eps = append(p.eps, endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint("e", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1)}))
	}
}

// level is a detector whose saturation the test sets.
type level struct {
	mu sync.Mutex
	v  float64
}

func (l *level) Saturation([]*endpoints.Endpoint) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v
}

func (l *level) set(v float64) {
	l.mu.Lock()
	l.v = v
	l.mu.Unlock()
}

func plugin[T any](t testing.TB, f scheduling.Factory, params string) T {
	t.Helper()
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := f("", raw, &scheduling.Handle{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	return p.(T)
}

type setup struct {
	c    *flowcontrol.Controller
	pool *pool
	sat  *level
	done []*flowcontrol.Item
}

func newSetup(t testing.TB, mutate func(*flowcontrol.Config)) *setup {
	t.Helper()
	s := &setup{pool: &pool{}, sat: &level{}}
	s.pool.set(2)
	band := flowcontrol.BandConfig{
		Fairness: plugin[flowcontrol.FairnessPolicy](t, flowpolicy.NewGlobalStrict, ""),
		Ordering: plugin[flowcontrol.OrderingPolicy](t, flowpolicy.NewFCFS, ""),
	}
	cfg := flowcontrol.Config{
		RequestTTL: time.Minute, NoEndpointTTL: time.Minute,
		DefaultBand: band, DefaultNegativeBand: band,
		UsageLimit: plugin[flowcontrol.UsageLimitPolicy](t, flowpolicy.NewStaticLimit, ""),
		Detector:   s.sat,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := flowcontrol.New(cfg, flowcontrol.Options{Pool: s.pool, OnFinish: func(it *flowcontrol.Item) { s.done = append(s.done, it) }})
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	return s
}

func (s *setup) enqueue(t testing.TB, id, fairness string, prio int, at time.Time) *flowcontrol.Item {
	t.Helper()
	it, err := s.c.Enqueue(flowcontrol.Request{ID: id, FairnessID: fairness, Priority: prio, Bytes: 100, ReceivedAt: at}, at)
	if err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
	return it
}

// drain dispatches everything at now, returning the ids in order.
func (s *setup) drain(now time.Time) []string {
	var ids []string
	for it := s.c.Next(now); it != nil; it = s.c.Next(now) {
		ids = append(ids, it.Request().ID)
	}
	return ids
}

func TestDispatchOrder(t *testing.T) {
	rr := func(cfg *flowcontrol.Config) {
		cfg.DefaultBand.Fairness = plugin[flowcontrol.FairnessPolicy](t, flowpolicy.NewRoundRobin, "")
	}
	type req struct {
		id, fairness string
		prio         int
	}
	tests := []struct {
		name   string
		config func(*flowcontrol.Config)
		reqs   []req
		want   string
	}{
		{"strict priority, FCFS within a band", nil,
			[]req{{"lo1", "a", -1}, {"mid1", "a", 0}, {"hi1", "b", 10}, {"mid2", "b", 0}, {"hi2", "a", 10}, {"lo2", "b", -1}},
			"hi1 hi2 mid1 mid2 lo1 lo2"},
		{"round robin across tenants 6:3:1", rr,
			[]req{{"a1", "a", 0}, {"a2", "a", 0}, {"a3", "a", 0}, {"a4", "a", 0}, {"a5", "a", 0}, {"a6", "a", 0}, {"b1", "b", 0}, {"b2", "b", 0}, {"b3", "b", 0}, {"c1", "c", 0}},
			"a1 b1 c1 a2 b2 a3 b3 a4 a5 a6"},
		{"global strict ignores tenants", nil,
			[]req{{"a1", "a", 0}, {"a2", "a", 0}, {"b1", "b", 0}, {"a3", "a", 0}},
			"a1 a2 b1 a3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, tc.config)
			s.sat.set(1) // hold everything
			for i, r := range tc.reqs {
				s.enqueue(t, r.id, r.fairness, r.prio, t0.Add(time.Duration(i)*time.Millisecond))
			}
			now := t0.Add(time.Second)
			if got := s.drain(now); len(got) != 0 {
				t.Fatalf("dispatched %v while saturated", got)
			}
			s.sat.set(0)
			if got := strings.Join(s.drain(now), " "); got != tc.want {
				t.Errorf("order %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDeadlineOrdering(t *testing.T) {
	tests := []struct {
		name    string
		factory scheduling.Factory
		// per request: client deadline offset, TTFT SLO (0: none)
		deadline []time.Duration
		slo      []time.Duration
		want     string
	}{
		{"edf by client deadline, none last", flowpolicy.NewEDF,
			[]time.Duration{0, 5 * time.Second, 2 * time.Second, 0}, []time.Duration{0, 0, 0, 0}, "r2 r1 r0 r3"},
		{"slo deadline, none last", flowpolicy.NewSLODeadline,
			[]time.Duration{0, 0, 0, 0}, []time.Duration{0, 900 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second}, "r2 r1 r3 r0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, func(cfg *flowcontrol.Config) {
				cfg.RequestTTL, cfg.NoEndpointTTL = 0, 0
				cfg.DefaultBand.Ordering = plugin[flowcontrol.OrderingPolicy](t, tc.factory, "")
			})
			s.sat.set(1)
			for i := range tc.deadline {
				at := t0.Add(time.Duration(i) * time.Millisecond)
				r := flowcontrol.Request{ID: fmt.Sprint("r", i), FairnessID: "f", ReceivedAt: at, TTFTSLO: tc.slo[i]}
				if d := tc.deadline[i]; d > 0 {
					r.Deadline = at.Add(d)
				}
				if _, err := s.c.Enqueue(r, at); err != nil {
					t.Fatal(err)
				}
			}
			s.sat.set(0)
			if got := strings.Join(s.drain(t0.Add(time.Second)), " "); got != tc.want {
				t.Errorf("order %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCapacityLimits(t *testing.T) {
	tests := []struct {
		name   string
		config func(*flowcontrol.Config)
		prio   []int
		empty  bool
		want   []flowcontrol.Outcome // per request: Dispatched means queued
	}{
		{"global maxRequests", func(c *flowcontrol.Config) { c.MaxRequests = 2 }, []int{0, 5, -1},
			false, []flowcontrol.Outcome{flowcontrol.Dispatched, flowcontrol.Dispatched, flowcontrol.RejectedCapacity}},
		{"global maxBytes", func(c *flowcontrol.Config) { c.MaxBytes = 250 }, []int{0, 0, 0},
			false, []flowcontrol.Outcome{flowcontrol.Dispatched, flowcontrol.Dispatched, flowcontrol.RejectedCapacity}},
		{"band maxRequests, other band free", func(c *flowcontrol.Config) { c.DefaultNegativeBand.MaxRequests = 1 }, []int{-1, -1, 0},
			false, []flowcontrol.Outcome{flowcontrol.Dispatched, flowcontrol.RejectedCapacity, flowcontrol.Dispatched}},
		{"band maxBytes", func(c *flowcontrol.Config) { c.DefaultBand.MaxBytes = 150 }, []int{0, 0},
			false, []flowcontrol.Outcome{flowcontrol.Dispatched, flowcontrol.RejectedCapacity}},
		{"full with no endpoints", func(c *flowcontrol.Config) { c.MaxRequests = 1 }, []int{0, 0},
			true, []flowcontrol.Outcome{flowcontrol.Dispatched, flowcontrol.RejectedNoEndpoints}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, tc.config)
			if tc.empty {
				s.pool.set(0)
			}
			for i, p := range tc.prio {
				_, err := s.c.Enqueue(flowcontrol.Request{ID: fmt.Sprint(i), FairnessID: "f", Priority: p, Bytes: 100}, t0)
				got := flowcontrol.Dispatched
				var fe *flowcontrol.Error
				if errors.As(err, &fe) {
					got = fe.Outcome
				} else if err != nil {
					t.Fatal(err)
				}
				if got != tc.want[i] {
					t.Errorf("request %d: %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

func TestTTLs(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name          string
		ttl, noEP     time.Duration
		emptyAt       time.Duration // pool empties at this offset (-1: never)
		refillAt      time.Duration // and refills (-1: never)
		expireAt      time.Duration
		want          flowcontrol.Outcome
		wantPoolEmpty bool
	}{
		{"default TTL with endpoints", 100 * ms, 100 * ms, -1, -1, 100 * ms, flowcontrol.EvictedTTL, false},
		{"no-endpoint TTL", 100 * ms, 30 * ms, 0, -1, 30 * ms, flowcontrol.EvictedNoEndpoints, true},
		{"regime change starts a fresh budget", 100 * ms, 300 * ms, -1, -1, 100 * ms, flowcontrol.EvictedTTL, false},
		{"back to endpoints: fresh budget, bounded by the longer", 100 * ms, 150 * ms, 0, 120 * ms, 150 * ms, flowcontrol.EvictedTTL, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, func(c *flowcontrol.Config) { c.RequestTTL, c.NoEndpointTTL = tc.ttl, tc.noEP })
			s.sat.set(1)
			if tc.emptyAt == 0 {
				s.pool.set(0)
			}
			it := s.enqueue(t, "r", "f", 0, t0)
			for at := time.Duration(0); at < tc.expireAt; at += ms {
				if at == tc.refillAt {
					s.pool.set(2)
				}
				s.c.Next(t0.Add(at))
				if len(s.done) != 0 {
					t.Fatalf("expired at %v, want %v", at, tc.expireAt)
				}
			}
			s.c.Next(t0.Add(tc.expireAt))
			if len(s.done) != 1 || s.done[0] != it {
				t.Fatalf("not expired at %v", tc.expireAt)
			}
			var fe *flowcontrol.Error
			if !errors.As(it.Err(), &fe) || fe.Outcome != tc.want || fe.PoolEmpty != tc.wantPoolEmpty {
				t.Errorf("err %v (pool empty %v), want %v (pool empty %v)", it.Err(), fe != nil && fe.PoolEmpty, tc.want, tc.wantPoolEmpty)
			}
			if at, ok := s.c.NextExpiry(); ok {
				t.Errorf("expiry %v left with an empty queue", at)
			}
		})
	}
}

func TestCancelAndShutdown(t *testing.T) {
	s := newSetup(t, nil)
	s.sat.set(1)
	a := s.enqueue(t, "a", "f", 0, t0)
	b := s.enqueue(t, "b", "f", 0, t0)
	if !s.c.Cancel(a, t0) || s.c.Cancel(a, t0) {
		t.Fatal("cancel of a queued item must succeed once")
	}
	if a.Outcome() != flowcontrol.EvictedContextCancelled || s.c.Len() != 1 {
		t.Fatalf("outcome %v, queued %d", a.Outcome(), s.c.Len())
	}
	s.c.Close()
	_, err := s.c.Enqueue(flowcontrol.Request{ID: "c", FairnessID: "f"}, t0)
	var fe *flowcontrol.Error
	if !errors.As(err, &fe) || !fe.ShuttingDown || fe.Outcome != flowcontrol.RejectedOther {
		t.Fatalf("enqueue after close: %v", err)
	}
	s.c.EvictAll(t0)
	if !errors.As(b.Err(), &fe) || !fe.ShuttingDown || fe.Outcome != flowcontrol.EvictedOther || s.c.Len() != 0 {
		t.Fatalf("evicted at shutdown: %v", b.Err())
	}
	if snap := s.c.Snapshot(); snap.Queued != 0 || snap.Bytes != 0 || len(snap.Bands) != 1 || snap.Bands[0].Flows != 0 {
		t.Errorf("state left behind: %+v", snap)
	}
}

func TestUsageLimitPolicies(t *testing.T) {
	tests := []struct {
		name    string
		factory scheduling.Factory
		params  string
		sat     float64
		// dispatched per band over calls, with 2 bands (10 and 0) each
		// holding plenty of requests
		calls          int
		wantHi, wantLo int
	}{
		{"static 1.0 lets both through below 1", flowpolicy.NewStaticLimit, "", 0.6, 40, 20, 20},
		{"static threshold 0.5 blocks everything at 0.6", flowpolicy.NewStaticLimit, `{"threshold": 0.5}`, 0.6, 40, 0, 0},
		{"holdback gates the low band first", flowpolicy.NewHoldback, `{"minCeiling": 0.5}`, 0.6, 40, 20, 0},
		{"holdback below every ceiling", flowpolicy.NewHoldback, `{"minCeiling": 0.5}`, 0.4, 40, 20, 20},
		// s = 0.75: reflective ceiling of band 1 is 0.25, period 3.
		{"soft reflective alternates the gated band", flowpolicy.NewSoftReflect, "", 0.75, 60, 20, 14},
		{"soft reflective closes lower bands at 1", flowpolicy.NewSoftReflect, "", 1, 40, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, func(c *flowcontrol.Config) {
				c.UsageLimit = plugin[flowcontrol.UsageLimitPolicy](t, tc.factory, tc.params)
			})
			s.sat.set(tc.sat)
			for i := range 20 {
				s.enqueue(t, fmt.Sprint("hi", i), "f", 10, t0)
			}
			for i := range 40 {
				s.enqueue(t, fmt.Sprint("lo", i), "f", 0, t0)
			}
			hi, lo := 0, 0
			for range tc.calls {
				it := s.c.Next(t0)
				switch {
				case it == nil:
				case it.Request().Priority == 10:
					hi++
				default:
					lo++
				}
			}
			if hi != tc.wantHi || math.Abs(float64(lo-tc.wantLo)) > 1 {
				t.Errorf("dispatched hi %d lo %d, want %d %d", hi, lo, tc.wantHi, tc.wantLo)
			}
		})
	}
}

func TestFlowsBounded(t *testing.T) {
	s := newSetup(t, func(c *flowcontrol.Config) { c.DefaultBand.MaxRequests = 2 * flowcontrol.MaxFlowsPerBand })
	s.sat.set(1)
	for i := range flowcontrol.MaxFlowsPerBand + 50 {
		s.enqueue(t, fmt.Sprint(i), fmt.Sprint("tenant-", i), 0, t0)
	}
	snap := s.c.Snapshot()
	if snap.Bands[0].Flows != flowcontrol.MaxFlowsPerBand || snap.Queued != flowcontrol.MaxFlowsPerBand+50 {
		t.Errorf("flows %d queued %d", snap.Bands[0].Flows, snap.Queued)
	}
}

func TestEviction(t *testing.T) {
	s := newSetup(t, func(c *flowcontrol.Config) { c.EnableEviction = true })
	// Three sheddable requests run; then the pool saturates and a
	// priority-0 request waits.
	var revoked []string
	var inflight []*flowcontrol.Item
	for i, p := range []int{-1, -5, -1} {
		s.enqueue(t, fmt.Sprint("batch", i), "b", p, t0.Add(time.Duration(i)*time.Millisecond))
		it := s.c.Next(t0.Add(time.Duration(i) * time.Millisecond))
		id := it.Request().ID
		s.c.Track(it, t0.Add(time.Duration(i)*time.Millisecond), func() { revoked = append(revoked, id) })
		inflight = append(inflight, it)
	}
	s.sat.set(1.6) // credit 1/len(pool) = 0.5 per request: two revocations
	s.enqueue(t, "chat", "c", 0, t0.Add(time.Second))
	if it := s.c.Next(t0.Add(time.Second)); it != nil {
		t.Fatal("dispatched while saturated")
	}
	if got := strings.Join(revoked, " "); got != "batch1 batch2" {
		t.Fatalf("revoked %q, want the lowest priority then the newest", got)
	}
	// Pending credit covers the target: no more revocations.
	s.c.Next(t0.Add(time.Second))
	if len(revoked) != 2 {
		t.Fatalf("revoked again before confirmation: %v", revoked)
	}
	s.c.Finished(inflight[1], t0.Add(time.Second))
	s.c.Finished(inflight[2], t0.Add(time.Second))
	s.sat.set(0.5)
	if it := s.c.Next(t0.Add(time.Second)); it == nil || it.Request().ID != "chat" {
		t.Fatalf("chat not dispatched after reclaim: %v", it)
	}
	if snap := s.c.Snapshot(); snap.InFlightSheddable != 1 {
		t.Errorf("tracked %d, want 1", snap.InFlightSheddable)
	}
}

// BenchmarkQueuedRequest measures the memory one queued request costs and
// the cost of enqueue plus dispatch, without metrics and with the
// Prometheus recorder (every enqueue and dispatch writes its series).
func BenchmarkQueuedRequest(b *testing.B) {
	for _, bc := range []struct {
		name string
		rec  func(testing.TB) flowcontrol.Recorder
	}{
		{"nop", func(testing.TB) flowcontrol.Recorder { return nil }},
		{"metrics", func(t testing.TB) flowcontrol.Recorder {
			m, err := flowcontrol.NewMetrics(prometheus.NewRegistry(), "pool")
			if err != nil {
				t.Fatal(err)
			}
			return m
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var cfg flowcontrol.Config
			s := newSetup(b, func(c *flowcontrol.Config) {
				c.DefaultBand.MaxRequests = int64(b.N) + 1
				c.DefaultBand.MaxBytes = 1 << 62
				cfg = *c
			})
			c, err := flowcontrol.New(cfg, flowcontrol.Options{Pool: s.pool, Recorder: bc.rec(b)})
			if err != nil {
				b.Fatal(err)
			}
			s.sat.set(1)
			reqs := make([]flowcontrol.Request, b.N)
			for i := range reqs {
				reqs[i] = flowcontrol.Request{ID: "r", FairnessID: fmt.Sprint("t", i%16), Model: "m", TargetModel: "m", Bytes: 1}
			}
			var before, after runtimeMem
			before.read()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range reqs {
				if _, err := c.Enqueue(reqs[i], t0); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after.read()
			b.ReportMetric(float64(after.heap-before.heap)/float64(b.N), "heapB/queued")
			s.sat.set(0)
			b.StartTimer()
			for c.Next(t0) != nil {
			}
		})
	}
}
