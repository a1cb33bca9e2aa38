package transfercost_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// path is a NetworkView with one bandwidth for every pair it knows.
type path struct {
	bw    float64
	known bool
}

func (p path) PathBetween(from, to string) (float64, time.Duration, bool) {
	return p.bw, 50 * time.Microsecond, p.known
}

const head = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"

// fleetConfig is a P/D configuration deciding with the transfer-cost
// decider; predictor adds predicted-latency-producer.
func fleetConfig(predictor bool, params string) string {
	c := head + `- type: prefix-cache-scorer
- type: decode-filter
- type: prefill-filter
- type: queue-scorer
- type: transfer-cost-pd-decider
  parameters: {` + params + `}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: transfer-cost-pd-decider}}
- type: p2p-source-producer
  parameters: {pullDecider: transfer-cost-pd-decider}
`
	if predictor {
		c += "- type: predicted-latency-producer\n"
	}
	return c + `schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: transfer-cost-pd-decider}]
`
}

func build(t testing.TB, yaml string, view transfercost.NetworkView) *config.Built {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	services := map[string]any{}
	if view != nil {
		services[transfercost.ServiceNetworkView] = view
	}
	b, err := config.Build(c, all.Registry(), &scheduling.Handle{Services: services}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decider(b *config.Built) *transfercost.Decider {
	for _, p := range b.Plugins {
		if d, ok := p.(*transfercost.Decider); ok {
			return d
		}
	}
	return nil
}

// decide schedules a cold prompt of n tokens and returns the prefill
// server named, "" for a local prefill.
func decide(t *testing.T, b *config.Built, eps []*endpoints.Endpoint, n int) string {
	t.Helper()
	req := &scheduling.Request{ID: "r", PromptTokens: n}
	cs := scheduling.NewCycleState()
	res, err := b.Scheduler.Schedule(context.Background(), cs, req, eps)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range b.PreRequest {
		h.PreRequest(context.Background(), cs, req, res)
	}
	return res.Headers[eppwire.HeaderPrefiller]
}

// A decode server with a prefill backlog prefills a long prompt faster on
// an idle prefill server, when the network moves its KV fast enough; not
// when the decode server is idle or the network slow.
func TestDecision(t *testing.T) {
	for _, predictor := range []bool{false, true} {
		name := "static"
		if predictor {
			name = "predicted"
		}
		t.Run(name, func(t *testing.T) {
			d := schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
			p := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
			eps := []*endpoints.Endpoint{d, p}
			b := build(t, fleetConfig(predictor, "overhead: 1ms"), nil)
			if got := decide(t, b, eps, 8000); got != "" {
				t.Errorf("idle decode server: prefill sent to %s", got)
			}
			backlog := d.Charge(0, 60000, 60000, 60000)
			defer backlog.Release()
			if got := decide(t, b, eps, 8000); got != p.Address() {
				t.Errorf("busy decode server, fast default network: prefill %q, want %s", got, p.Address())
			}
			// 8000 tokens of 128 KiB over 100 MB/s: 10 s, more than the
			// backlog costs.
			decider(b).SetNetworkView(path{bw: 1e8, known: true})
			if got := decide(t, b, eps, 8000); got != "" {
				t.Errorf("slow measured path: prefill sent to %s", got)
			}
			// An unknown path falls back to the static parameters.
			decider(b).SetNetworkView(path{bw: 1e8, known: false})
			if got := decide(t, b, eps, 8000); got != p.Address() {
				t.Errorf("unmeasured path: prefill %q, want the static fast network", got)
			}
		})
	}
}

// The view can come as a handle service, and the prefill profile scores
// prefill servers by predicted remote TTFT: the one the network reaches
// fast wins over a nearer-idle one it reaches slowly.
func TestScoreFollowsNetwork(t *testing.T) {
	d := schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	near := schedtest.Endpoint("near", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	far := schedtest.Endpoint("far", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	view := byPair{near.Address(): 2e10, far.Address(): 1e9}
	b := build(t, fleetConfig(false, ""), view)
	backlog := d.Charge(0, 80000, 80000, 80000)
	defer backlog.Release()
	if got := decide(t, b, []*endpoints.Endpoint{d, far, near}, 8000); got != near.Address() {
		t.Errorf("prefill %q, want the fast path's %s", got, near.Address())
	}
}

// byPair gives each source address its bandwidth.
type byPair map[string]float64

func (b byPair) PathBetween(from, to string) (float64, time.Duration, bool) {
	bw, ok := b[from]
	return bw, 0, ok
}

func TestPullPays(t *testing.T) {
	src := schedtest.Endpoint("s", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	c := schedtest.Endpoint("c", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	b := build(t, fleetConfig(false, ""), nil)
	dec := decider(b)
	cs := scheduling.NewCycleState()
	if dec.PullPays(cs, src, c, 1000) {
		t.Error("pull decided before Produce")
	}
	dec.Produce(context.Background(), cs, &scheduling.Request{PromptTokens: 2000}, []*endpoints.Endpoint{src, c})
	// 1000 tokens: 131 MB at 12 GB/s is 11 ms, recomputing them 63 ms.
	if !dec.PullPays(cs, src, c, 1000) {
		t.Error("fast network: pull refused")
	}
	dec.SetNetworkView(path{bw: 1e9, known: true}) // 131 ms
	if dec.PullPays(cs, src, c, 1000) {
		t.Error("slow network: pull made")
	}
}

func TestParams(t *testing.T) {
	// Each error names the parameter that is wrong.
	for _, bad := range []string{"kvBytesPerToken: 0", "bandwidthBytesPerSecond: -1", "prefillTokensPerSecond: 0", "rtt: -1s", "overhead: -1ms", "decodeStep: -10ms",
		"decodeStep: 1e10", "rtt: soon", "prefillFilter: nothing", "prefillFilter: queue-scorer", "bandwidth: 1", "queueWeight: -1", "interferenceWeight: -1"} {
		c, err := config.Parse([]byte(fleetConfig(false, bad)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := config.Build(c, all.Registry(), &scheduling.Handle{Services: map[string]any{}}, nil); err == nil {
			t.Errorf("%s accepted", bad)
		} else if name, _, _ := strings.Cut(bad, ":"); !strings.Contains(err.Error(), "parameters."+name) && !strings.Contains(err.Error(), fmt.Sprintf("unknown field %q", name)) {
			t.Errorf("%s: %v does not name %s", bad, err, name)
		}
	}
}

// load puts decodes sequences decoding on e and backlog prefill tokens in
// its queue, until the test ends.
func load(t *testing.T, e *endpoints.Endpoint, decodes int, backlog int64) {
	t.Helper()
	for range decodes {
		c := e.Charge(0, 512, 768, 768)
		c.FirstToken()
		t.Cleanup(c.Release)
	}
	if backlog > 0 {
		c := e.Charge(0, backlog, backlog, backlog)
		t.Cleanup(c.Release)
	}
}

// The decision pattern: P/D for long prompts over a fast path while the
// decode server is decoding (the local prefill would stall its batch for
// longer than the remote leg costs); not for short prompts, whose stall is
// a few milliseconds, nor over a slow path, nor onto a prefill server with
// two long prefills queued; a decode server with a long prefill queue
// sends even short ones away. The weights move the line: the default
// weight 2 sends a long prompt behind one queued prefill, the spike
// counted once keeps it local, TTFT alone keeps it local with no prefill
// queued, the sum of every decoding sequence's stall sends a 1k-token one away (not
// a 256-token one: it fits in the compute a decode step leaves idle).
func TestDecisionPattern(t *testing.T) {
	const (
		fast = 50e9   // 400 Gb/s
		slow = 1.25e9 // 10 GbE
	)
	for _, c := range []struct {
		name             string
		params           string
		prompt           int
		bw               float64
		decodes          int
		decodeBacklog    int64
		prefillBacklog   int64
		wantDisaggregate bool
	}{
		{name: "long prompt, fast path", prompt: 8000, bw: fast, decodes: 32, wantDisaggregate: true},
		{name: "long prompt, slow path", prompt: 8000, bw: slow, decodes: 32},
		{name: "short prompt, fast path", prompt: 256, bw: fast, decodes: 32},
		{name: "short prompt, slow path", prompt: 256, bw: slow, decodes: 32},
		{name: "long prompt, fast path, idle decode server", prompt: 8000, bw: fast},
		{name: "long prompt, fast path, queued prefill server", prompt: 8000, bw: fast, decodes: 32, prefillBacklog: 16000},
		// One long prompt queued on the prefill server: P/D raises the TTFT
		// by more than the spike, less than twice it.
		{name: "long prompt, fast path, one prefill queued", prompt: 8000, bw: fast, decodes: 32, prefillBacklog: 8000, wantDisaggregate: true},
		{name: "spike counted once: long prompt, fast path, one prefill queued", params: "interferenceWeight: 1", prompt: 8000, bw: fast, decodes: 32, prefillBacklog: 8000},
		{name: "short prompt, slow path, queued decode server", prompt: 256, bw: slow, decodes: 32, decodeBacklog: 60000, wantDisaggregate: true},
		{name: "TTFT alone: long prompt, fast path", params: "interferenceWeight: 0", prompt: 8000, bw: fast, decodes: 32},
		{name: "sum of the stall: short prompt rides in the decode step", params: "decodeStallWeight: 1", prompt: 256, bw: fast, decodes: 32},
		{name: "sum of the stall: 1k prompt, fast path", params: "decodeStallWeight: 1", prompt: 1024, bw: fast, decodes: 32, wantDisaggregate: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
			p := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
			params := "prefillTokensPerSecond: 33000, decodeStep: 10ms"
			if c.params != "" {
				params += ", " + c.params
			}
			b := build(t, fleetConfig(false, params), path{bw: c.bw, known: true})
			load(t, d, c.decodes, c.decodeBacklog)
			load(t, p, 0, c.prefillBacklog)
			want := ""
			if c.wantDisaggregate {
				want = p.Address()
			}
			if got := decide(t, b, []*endpoints.Endpoint{d, p}, c.prompt); got != want {
				t.Errorf("prefiller %q, want %q", got, want)
			}
		})
	}
}

// As a scorer before any decision it rates decode servers by the cost of
// the request's best choice there and prefill servers by their own
// predicted TTFT; after the decision, prefill servers by their remote TTFT
// to the decode server chosen.
func TestScore(t *testing.T) {
	busy := schedtest.Endpoint("busy", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	idle := schedtest.Endpoint("idle", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	queued := schedtest.Endpoint("queued", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	free := schedtest.Endpoint("free", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	load(t, busy, 32, 60000)
	load(t, queued, 0, 60000)
	b := build(t, fleetConfig(false, "prefillTokensPerSecond: 33000"), path{bw: 50e9, known: true})
	dec := decider(b)
	all := []*endpoints.Endpoint{busy, idle, queued, free}
	req := &scheduling.Request{ID: "r", PromptTokens: 8000}
	cs := scheduling.NewCycleState()
	dec.Produce(context.Background(), cs, req, all)
	for _, c := range []struct {
		name string
		eps  []*endpoints.Endpoint
		want []float64
	}{
		{"decode servers", []*endpoints.Endpoint{busy, idle}, []float64{0, 1}},
		{"prefill servers, prefill-first", []*endpoints.Endpoint{queued, free}, []float64{0, 1}},
	} {
		scores := make([]float64, len(c.eps))
		dec.Score(context.Background(), cs, req, c.eps, scores)
		if fmt.Sprint(scores) != fmt.Sprint(c.want) {
			t.Errorf("%s: scores %v, want %v", c.name, scores, c.want)
		}
	}
	costs, ok := dec.Compare(context.Background(), cs, req, busy)
	if !ok || costs.Prefill != free || costs.Remote >= costs.Local {
		t.Fatalf("busy decode server: %+v, %v; want a remote prefill on free", costs, ok)
	}
	scores := make([]float64, 2)
	dec.Score(context.Background(), cs, req, []*endpoints.Endpoint{queued, free}, scores)
	if scores[0] != 0 || scores[1] != 1 {
		t.Errorf("prefill servers after the decision: scores %v, want [0 1]", scores)
	}
}

// A remote prefill's KV that lands while the decode server still prefills
// its own queue waits out steps carrying that queue's chunks (two of them:
// the step in progress and the one it is sampled in); one that lands after
// the queue is done does not.
func TestRemoteJoinsBusyDecodeServer(t *testing.T) {
	const rate, budget = 15928.0, 8192
	for _, c := range []struct {
		name    string
		backlog int64
		extra   float64 // seconds the backlog adds to the remote TTFT
	}{
		{"queue outlasts the prefill leg", 60000, 2 * budget / rate},
		{"queue done before the KV lands", 1000, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			busy := schedtest.Endpoint("busy", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
			idle := schedtest.Endpoint("idle", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
			p := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
			b := build(t, fleetConfig(false, fmt.Sprintf("prefillTokensPerSecond: %v, maxNumBatchedTokens: %d", rate, budget)), nil)
			backlog := busy.Charge(0, c.backlog, c.backlog, c.backlog)
			defer backlog.Release()
			req := &scheduling.Request{ID: "r", PromptTokens: 8000}
			cs := scheduling.NewCycleState()
			if _, err := b.Scheduler.Schedule(context.Background(), cs, req, []*endpoints.Endpoint{busy, idle, p}); err != nil {
				t.Fatal(err)
			}
			onBusy, ok1 := decider(b).Compare(context.Background(), cs, req, busy)
			onIdle, ok2 := decider(b).Compare(context.Background(), cs, req, idle)
			if !ok1 || !ok2 {
				t.Fatal("no comparison")
			}
			if got := (onBusy.Remote - onIdle.Remote).Seconds(); got < c.extra-1e-6 || got > c.extra+1e-6 {
				t.Errorf("remote TTFT on the busy decode server %v, on the idle one %v: %.4fs more, want %.4fs", onBusy.Remote, onIdle.Remote, got, c.extra)
			}
		})
	}
}

// With queueWeight a prefill is also charged the wait of the requests that
// reach its server while it runs, at the rate the decider measures: on
// idle servers a 2000-token prompt (0.126 s to prefill; P/D adds 0.024 s)
// stays local while requests arrive at 2/s, and is sent away at 20/s
// (10/s per decode server: 0.079 s of waiting behind it); without the
// term it stays local at any rate.
func TestQueueWeightMeasuredRate(t *testing.T) {
	for _, c := range []struct {
		params string
		rate   float64
		remote bool
	}{
		{"queueWeight: 1", 2, false},
		{"queueWeight: 1", 20, true},
		{"queueWeight: 0", 20, false},
	} {
		t.Run(fmt.Sprintf("%s at %v per s", c.params, c.rate), func(t *testing.T) {
			now := time.Unix(1e9, 0)
			cfg, err := config.Parse([]byte(fleetConfig(false, c.params)))
			if err != nil {
				t.Fatal(err)
			}
			b, err := config.Build(cfg, all.Registry(), &scheduling.Handle{Now: func() time.Time { return now }, Services: map[string]any{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			d1 := schedtest.Endpoint("d1", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
			d2 := schedtest.Endpoint("d2", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
			p := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
			eps := []*endpoints.Endpoint{d1, d2, p}
			// The decider sees the earlier requests arrive.
			for range 30 {
				decider(b).Produce(context.Background(), scheduling.NewCycleState(), &scheduling.Request{PromptTokens: 100}, eps)
				now = now.Add(time.Duration(float64(time.Second) / c.rate))
			}
			if got := decide(t, b, eps, 2000) != ""; got != c.remote {
				t.Errorf("disaggregated %v, want %v", got, c.remote)
			}
		})
	}
}

// A local prefill delays the sequences decoding on its server only by what
// its chunks add to the decode steps they run anyway: nothing for a prompt
// shorter than a step's worth of compute, the compute less one step per
// chunk for a longer one. The interference term (weight 1 against 0) is
// that delay.
func TestStallBeyondDecodeSteps(t *testing.T) {
	const rate, step = 33000.0, 0.010
	for _, c := range []struct {
		name    string
		prompt  int
		decodes int
		stall   float64
	}{
		{"within a decode step", 256, 32, 0},
		{"one chunk", 2000, 32, 2000/rate - step},
		{"two chunks", 10000, 32, 10000/rate - 2*step},
		{"nothing decoding", 2000, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			local := map[float64]time.Duration{}
			for _, w := range []float64{0, 1} {
				d := schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
				p := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
				load(t, d, c.decodes, 0)
				b := build(t, fleetConfig(false, fmt.Sprintf("prefillTokensPerSecond: %v, decodeStep: 10ms, interferenceWeight: %v", rate, w)), nil)
				req := &scheduling.Request{ID: "r", PromptTokens: c.prompt}
				cs := scheduling.NewCycleState()
				if _, err := b.Scheduler.Schedule(context.Background(), cs, req, []*endpoints.Endpoint{d, p}); err != nil {
					t.Fatal(err)
				}
				costs, ok := decider(b).Compare(context.Background(), cs, req, d)
				if !ok {
					t.Fatal("no comparison")
				}
				local[w] = costs.Local
			}
			if got := (local[1] - local[0]).Seconds(); got < c.stall-1e-6 || got > c.stall+1e-6 {
				t.Errorf("stall %.4fs, want %.4fs", got, c.stall)
			}
		})
	}
}

// The picker charges a remote prefill to its prefill server until the
// decode server's first token, but the server is free once it has computed
// it (the KV is then on the wire). The decider predicts the finish, the
// director puts it on the remote charge: past it, the prefill's tokens no
// longer delay the next prefill there. Once the director releases the
// charge (at the first token, or at the response's end without one) the
// rest of the server's backlog counts whole again, at once: a decision
// made right after the release, before any hook has run, sees it whole
// (the decider's own ledger of remote prefills, settled by its hooks after
// the release, subtracted a finished prefill twice in that window). The
// director releases it the same way at the first token and at a
// response's end without one.
func TestRemotePrefillComputedOnTheWire(t *testing.T) {
	const rate = 33000.0
	now := time.Unix(1e9, 0)
	cfg, err := config.Parse([]byte(fleetConfig(false, fmt.Sprintf("prefillTokensPerSecond: %v, decodeStep: 10ms", rate))))
	if err != nil {
		t.Fatal(err)
	}
	b, err := config.Build(cfg, all.Registry(), &scheduling.Handle{Now: func() time.Time { return now },
		Services: map[string]any{transfercost.ServiceNetworkView: path{bw: 50e9, known: true}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	p := schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	load(t, d, 32, 0)
	// Other work queued on p, not the decider's.
	load(t, p, 0, 4000)
	eps := []*endpoints.Endpoint{d, p}
	remote := func() time.Duration {
		t.Helper()
		req := &scheduling.Request{ID: "next", PromptTokens: 4000}
		cs := scheduling.NewCycleState()
		if _, err := b.Scheduler.Schedule(context.Background(), cs, req, eps); err != nil {
			t.Fatal(err)
		}
		c, ok := decider(b).Compare(context.Background(), cs, req, d)
		if !ok {
			t.Fatal("no comparison")
		}
		return c.Remote
	}
	base := remote()

	// The first request is prefilled on p, and charged there as
	// the director charges it.
	req := &scheduling.Request{ID: "first", PromptTokens: 8000}
	cs := scheduling.NewCycleState()
	res, err := b.Scheduler.Schedule(context.Background(), cs, req, eps)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prefill != p {
		t.Fatalf("first request prefilled on %v, want p", res.Prefill)
	}
	// Charged as the director charges a remote prefill: with the
	// finish the decision predicted there.
	finish, ok := scheduling.Read(cs, scheduling.PrefillFinishKey)
	if !ok {
		t.Fatal("no predicted prefill finish")
	}
	at, ok := finish.PrefillFinish(p)
	if !ok || !at.After(now) {
		t.Fatalf("predicted finish on p %v (%v), want after %v", at, ok, now)
	}
	charge := p.ChargeComputedBy(false, 0, 8000, 8000, 8000, at)
	defer charge.Release()
	queued := 8000 / rate
	if got := (remote() - base).Seconds(); got < queued-1e-3 || got > queued+1e-3 {
		t.Errorf("while it computes: remote TTFT %.4fs above the base, want its %.4fs", got, queued)
	}
	now = now.Add(time.Second)
	if got := remote(); got != base {
		t.Errorf("computed, KV on the wire: remote TTFT %v, want the base %v", got, base)
	}
	// The director's order: the charge, then the hooks; a
	// decision between the two sees the backlog whole.
	charge.Release()
	if got := remote(); got != base {
		t.Errorf("released, before the hooks: remote TTFT %v, want the base %v", got, base)
	}
	for _, h := range b.FirstToken {
		h.FirstToken(context.Background(), cs, req, &scheduling.Response{Endpoint: d})
	}
	if got := remote(); got != base {
		t.Errorf("settled: remote TTFT %v, want the base %v", got, base)
	}
}

// BenchmarkDecision is the decider's work per request on a fleet of
// decode and prefill servers, the decode servers with a prefill backlog:
// its snapshot (Produce), the decode profile's scores, the decision on
// the chosen server and a pull priced, then the decision's and the
// request's end.
func BenchmarkDecision(b *testing.B) {
	for _, n := range []int{4, 32} {
		b.Run(fmt.Sprint("servers=", 2*n), func(b *testing.B) {
			built := build(b, fleetConfig(false, ""), nil)
			d := decider(built)
			var eps []*endpoints.Endpoint
			for i := range n {
				e := schedtest.Endpoint(fmt.Sprint("d", i), endpoints.Metrics{}, endpoints.RoleLabel, "decode")
				c := e.Charge(0, 20000, 20000, 20000)
				defer c.Release()
				eps = append(eps, e)
			}
			for i := range n {
				eps = append(eps, schedtest.Endpoint(fmt.Sprint("p", i), endpoints.Metrics{}, endpoints.RoleLabel, "prefill"))
			}
			req := &scheduling.Request{ID: "r", PromptTokens: 8000}
			scores := make([]float64, len(eps))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				cs := scheduling.AcquireCycleState()
				d.Produce(ctx, cs, req, eps)
				d.Score(ctx, cs, req, eps[:n], scores[:n])
				d.Disaggregate(ctx, cs, req, eps[0])
				d.PullPays(cs, eps[1], eps[0], 1000)
				cs.Decided()
				cs.Release()
			}
		})
	}
}

// TestReusedBuffersDecideAsFresh: the per-candidate arrays a decision
// leaves to the pool carry nothing into the next one (of more or fewer
// candidates), and a state read after its decision finds no candidate.
func TestReusedBuffersDecideAsFresh(t *testing.T) {
	fleet := func(decoders, prefillers int) []*endpoints.Endpoint {
		var eps []*endpoints.Endpoint
		for i := range decoders {
			eps = append(eps, schedtest.Endpoint(fmt.Sprint("d", i), endpoints.Metrics{}, endpoints.RoleLabel, "decode"))
		}
		for i := range prefillers {
			eps = append(eps, schedtest.Endpoint(fmt.Sprint("p", i), endpoints.Metrics{}, endpoints.RoleLabel, "prefill"))
		}
		return eps
	}
	big, small := fleet(6, 6), fleet(1, 1)
	backlog := small[0].Charge(0, 60000, 60000, 60000)
	defer backlog.Release()
	reused := build(t, fleetConfig(false, "overhead: 1ms"), nil)
	for range 3 {
		decide(t, reused, big, 8000)
	}
	tests := []struct {
		name   string
		prompt int
	}{{"long prompt, busy decode server", 8000}, {"short prompt", 10}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fresh := build(t, fleetConfig(false, "overhead: 1ms"), nil)
			if got, want := decide(t, reused, small, tt.prompt), decide(t, fresh, small, tt.prompt); got != want {
				t.Errorf("after larger decisions: prefill %q, a fresh decider %q", got, want)
			}
		})
	}
	d := decider(reused)
	cs := scheduling.NewCycleState()
	req := &scheduling.Request{ID: "r", PromptTokens: 8000}
	d.Produce(context.Background(), cs, req, small)
	if !d.PullPays(cs, small[1], small[0], 1000) {
		t.Fatal("no pull priced before the decision")
	}
	cs.Decided()
	if d.PullPays(cs, small[1], small[0], 1000) {
		t.Error("a pull priced after the decision, from arrays returned to the pool")
	}
	if _, ok := d.Compare(context.Background(), cs, req, small[0]); ok {
		t.Error("a comparison after the decision")
	}
}
