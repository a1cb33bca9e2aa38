package flowpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

var now = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func build(t *testing.T, f scheduling.Factory, params string, clock func() time.Time) scheduling.Plugin {
	t.Helper()
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := f("", raw, &scheduling.Handle{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ep is an endpoint scraped at age before now with waiting requests and KV
// use, and the picker's own requests: prefill ones (no first token yet)
// and decoding ones.
func ep(i int, age time.Duration, waiting int, kv float64, prefill, decode int) *endpoints.Endpoint {
	e := endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint("e", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1)})
	m := &endpoints.Metrics{WaitingQueueSize: waiting, KVCacheUsage: kv, UpdateTime: now.Add(-age)}
	if age < 0 {
		m.UpdateTime = time.Time{}
	}
	e.SetMetrics(m)
	for range prefill {
		e.Charge(0, 100, 200, 1000)
	}
	for range decode {
		c := e.Charge(0, 100, 200, 1000)
		c.FirstToken()
	}
	return e
}

func TestUtilizationDetector(t *testing.T) {
	clock := func() time.Time { return now }
	tests := []struct {
		name   string
		params string
		eps    []*endpoints.Endpoint
		want   float64
		kept   int
	}{
		{"idle", "", []*endpoints.Endpoint{ep(0, 0, 0, 0, 0, 0), ep(1, 0, 0, 0, 0, 0)}, 0, 2},
		// The picker's own prefill-phase requests count at once, before a
		// scrape shows them; decoding ones are not queued.
		{"live queue", "", []*endpoints.Endpoint{ep(0, 0, 0, 0, 5, 3), ep(1, 0, 0, 0, 0, 0)}, 0.5, 2},
		{"kv bound", "", []*endpoints.Endpoint{ep(0, 0, 0, 0.8, 0, 0), ep(1, 0, 0, 0.4, 0, 0)}, 0.75, 2},
		{"stale fails closed", "", []*endpoints.Endpoint{ep(0, time.Second, 0, 0, 0, 0), ep(1, 0, 0, 0, 0, 0)}, 0.5, 1},
		{"never scraped", "", []*endpoints.Endpoint{ep(0, -1, 0, 0, 0, 0)}, 1, 1},
		{"oversubscribed, filter fails open", `{"queueDepthThreshold": 2}`, []*endpoints.Endpoint{ep(0, 0, 0, 0, 6, 0), ep(1, 0, 0, 0, 4, 0)}, 2.5, 2},
		{"headroom widens the filter", `{"queueDepthThreshold": 2, "headroom": 0.5}`, []*endpoints.Endpoint{ep(0, 0, 0, 0, 3, 0), ep(1, 0, 0, 0, 4, 0)}, 1.75, 1},
		{"empty pool", "", nil, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := build(t, NewUtilization, tc.params, clock).(*Utilization)
			if got := u.Saturation(tc.eps); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("saturation %v, want %v", got, tc.want)
			}
			if got := u.Filter(context.Background(), nil, nil, append([]*endpoints.Endpoint(nil), tc.eps...)); len(got) != tc.kept {
				t.Errorf("filter kept %d, want %d", len(got), tc.kept)
			}
		})
	}
}

func TestConcurrencyDetector(t *testing.T) {
	eps := []*endpoints.Endpoint{ep(0, 0, 0, 0, 2, 2), ep(1, 0, 0, 0, 0, 0)} // 4 requests, 4000 tokens on e0
	tests := []struct {
		params string
		want   float64
		kept   int
	}{
		{`{"maxConcurrency": 4}`, 0.5, 1},
		{`{"maxConcurrency": 8}`, 0.25, 2},
		{`{"concurrencyMode": "tokens", "maxTokenConcurrency": 2000}`, 1, 1},
		// hybrid: mean of max(4/10, 4000/4000) and 0.
		{`{"concurrencyMode": "hybrid", "maxConcurrency": 10, "maxTokenConcurrency": 4000}`, 0.5, 1},
		{`{"maxConcurrency": 4, "headroom": 0.5}`, 0.5, 2},
	}
	for _, tc := range tests {
		t.Run(tc.params, func(t *testing.T) {
			c := build(t, NewConcurrency, tc.params, nil).(*Concurrency)
			if got := c.Saturation(eps); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("saturation %v, want %v", got, tc.want)
			}
			if got := c.Filter(context.Background(), nil, nil, append([]*endpoints.Endpoint(nil), eps...)); len(got) != tc.kept {
				t.Errorf("filter kept %d, want %d", len(got), tc.kept)
			}
		})
	}
	for _, bad := range []string{`{"concurrencyMode": "bytes"}`, `{"maxConcurrency": 0}`, `{"headroom": -1}`} {
		if _, err := NewConcurrency("", json.RawMessage(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestHoldbackCeilings(t *testing.T) {
	tests := []struct {
		params string
		prios  []int
		want   []float64
	}{
		{`{"minCeiling": 0.5}`, []int{100, 60, 30, 10, -5, -10}, []float64{1, 0.9, 0.8, 0.7, 0.6, 0.5}},
		{`{"minCeiling": 0.2, "maxCeiling": 0.8, "domain": "value"}`, []int{100, 50, 0}, []float64{0.8, 0.5, 0.2}},
		{`{"minCeiling": 0.2}`, []int{7}, []float64{1}},
	}
	for _, tc := range tests {
		h := build(t, NewHoldback, tc.params, nil).(*Holdback)
		got := make([]float64, len(tc.prios))
		h.Ceilings(0.5, tc.prios, got)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("%s: ceilings %v, want %v", tc.params, got, tc.want)
				break
			}
		}
	}
	for _, bad := range []string{`{}`, `{"minCeiling": 1}`, `{"minCeiling": 0.5, "shape": "cubic"}`, `{"minCeiling": 0.6, "maxCeiling": 0.5}`, `{"minCeiling": 0.5, "domain": "log"}`} {
		if _, err := NewHoldback("", json.RawMessage(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// program-aware-fairness serves the program with the least attained
// service; service decays with its half-life.
func TestProgramAwareLeastAttainedService(t *testing.T) {
	clock := now
	p := build(t, NewProgramAware, `{"lasHalfLifeSeconds": 10}`, func() time.Time { return clock }).(*ProgramAware)
	for _, c := range []struct {
		id     string
		in, op int
	}{{"heavy", 1000, 500}, {"light", 100, 10}} {
		req := &scheduling.Request{FairnessID: c.id}
		p.PreRequest(context.Background(), nil, req, nil)
		p.ResponseComplete(context.Background(), nil, req, &scheduling.Response{Usage: openai.Usage{PromptTokens: c.in, CompletionTokens: c.op}})
	}
	if got := p.Service("heavy"); got != 2000 {
		t.Fatalf("heavy service %v, want 1000 + 2·500", got)
	}
	clock = clock.Add(10 * time.Second)
	if got := p.Service("heavy"); math.Abs(got-1000) > 1e-6 {
		t.Fatalf("after one half-life %v, want 1000", got)
	}

	c := controllerOf(t, p)
	// heavy's requests arrived first, yet light is served first.
	for i, id := range []string{"heavy", "heavy", "light"} {
		if _, err := c.Enqueue(flowcontrol.Request{ID: fmt.Sprint(id, i), FairnessID: id}, clock); err != nil {
			t.Fatal(err)
		}
	}
	if it := c.Next(clock); it == nil || it.Request().FairnessID != "light" {
		t.Fatalf("dispatched %v, want light", it)
	}
}

// controllerOf is a flow controller of one never-saturated endpoint whose
// bands use fairness.
func controllerOf(t *testing.T, fairness flowcontrol.FairnessPolicy) *flowcontrol.Controller {
	t.Helper()
	band := flowcontrol.BandConfig{Fairness: fairness, Ordering: build(t, NewFCFS, "", nil).(flowcontrol.OrderingPolicy)}
	c, err := flowcontrol.New(flowcontrol.Config{DefaultBand: band, DefaultNegativeBand: band,
		UsageLimit: build(t, NewStaticLimit, "", nil).(flowcontrol.UsageLimitPolicy), Detector: zero{}},
		flowcontrol.Options{Pool: poolOf{ep(0, 0, 0, 0, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type zero struct{}

func (zero) Saturation([]*endpoints.Endpoint) float64 { return 0 }

type poolOf []*endpoints.Endpoint

func (p poolOf) Candidates() []*endpoints.Endpoint { return p }

// program-aware-fairness exports llm-d's program metrics when offered a
// registerer; a second instance shares them.
func TestProgramAwareMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := &scheduling.Handle{Now: func() time.Time { return now }, Services: map[string]any{ServiceRegisterer: prometheus.Registerer(reg)}}
	p, err := NewProgramAware("", nil, h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewProgramAware("second", nil, h); err != nil {
		t.Fatalf("second instance: %v", err)
	}
	a := p.(*ProgramAware)
	req := &scheduling.Request{FairnessID: "tenant-a"}
	a.PreRequest(context.Background(), nil, req, nil)
	a.ResponseComplete(context.Background(), nil, req, &scheduling.Response{Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 5}})
	c := controllerOf(t, a)
	for _, id := range []string{"tenant-a", "tenant-b"} {
		if _, err := c.Enqueue(flowcontrol.Request{ID: id, FairnessID: id}, now.Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	for c.Next(now) != nil {
	}
	want := map[string]float64{
		`llm_d_epp_program_aware_attained_service_tokens{program_id="tenant-a"}`:    20,
		`llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id="tenant-a"}`: 1000,
		`llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id="tenant-b"}`: 1000,
		`llm_d_epp_program_aware_jains_fairness_index`:                              1,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			if len(m.GetLabel()) > 0 {
				name += fmt.Sprintf(`{%s="%s"}`, m.GetLabel()[0].GetName(), m.GetLabel()[0].GetValue())
			}
			got[name] = m.GetGauge().GetValue()
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// program-aware-fairness accepts las and turn-priority and refuses other
// strategies and negative turn-priority parameters.
func TestProgramAwareStrategy(t *testing.T) {
	for _, tc := range []struct {
		params string
		ok     bool
	}{
		{`{}`, true},
		{`{"strategy": "las"}`, true},
		{`{"strategy": "turn-priority", "turnPriorityTimeWeight": 0.05}`, true},
		{`{"strategy": "drr"}`, false},
		{`{"strategy": "turn-priority", "turnPriorityTimeWeight": -1}`, false},
		{`{"strategy": "turn-priority", "turnPriorityInactivitySeconds": -1}`, false},
	} {
		_, err := NewProgramAware("", json.RawMessage(tc.params), &scheduling.Handle{})
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.params, err, tc.ok)
		}
	}
}

// turn-priority dispatches the deepest session first; a head's wait, at
// turnPriorityTimeWeight turns a second, lets a shallower one overtake; an
// idle gap from the last completion to the head's arrival resets depth;
// default-flow has none.
func TestProgramAwareTurnPriority(t *testing.T) {
	type prog struct {
		id      string
		turns   int           // requests completed
		doneAgo time.Duration // last completion before the head arrived
		waited  time.Duration // the head's queue wait
		open    bool          // one request still in flight
	}
	tests := []struct {
		name   string
		params string
		progs  []prog
		want   string
	}{
		{"deeper first", `{"turnPriorityTimeWeight": 0}`, []prog{{id: "shallow", turns: 1}, {id: "deep", turns: 20}}, "deep"},
		{"wait overcomes depth", `{}`, []prog{{id: "deep", turns: 20}, {id: "new", waited: 50 * time.Second}}, "new"},
		{"depth beyond the weighted wait", `{}`, []prog{{id: "deep", turns: 60}, {id: "new", waited: 60 * time.Second}}, "deep"},
		{"idle resets to turn one", `{"turnPriorityTimeWeight": 0}`, []prog{{id: "idle", turns: 30, doneAgo: 10 * time.Minute}, {id: "b", turns: 2}}, "b"},
		{"queue wait is not idleness", `{"turnPriorityTimeWeight": 0}`, []prog{{id: "a", turns: 40, doneAgo: time.Second, waited: 10 * time.Minute}, {id: "b", turns: 2}}, "a"},
		{"in flight keeps depth", `{"turnPriorityTimeWeight": 0}`, []prog{{id: "a", turns: 5, doneAgo: 10 * time.Minute, open: true}, {id: "b", turns: 2}}, "a"},
		{"no inactivity reset", `{"turnPriorityTimeWeight": 0, "turnPriorityInactivitySeconds": 0}`, []prog{{id: "a", turns: 9, doneAgo: 30 * time.Minute}, {id: "b", turns: 2}}, "a"},
		{"default-flow has no depth", `{"turnPriorityTimeWeight": 0}`, []prog{{id: "default-flow", turns: 500}, {id: "s", turns: 3}}, "s"},
		{"tie: longer wait", `{"turnPriorityTimeWeight": 0}`, []prog{{id: "later", turns: 3, waited: 2 * time.Second}, {id: "earlier", turns: 3, waited: 10 * time.Second}}, "earlier"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := now
			params := `{"strategy": "turn-priority"}`
			if tc.params != `{}` {
				params = `{"strategy": "turn-priority", ` + strings.TrimPrefix(tc.params, "{")
			}
			p := build(t, NewProgramAware, params, func() time.Time { return clock }).(*ProgramAware)
			c := controllerOf(t, p)
			pick := now.Add(48 * time.Hour)
			for _, pr := range tc.progs {
				arrived := pick.Add(-pr.waited)
				clock = arrived.Add(-pr.doneAgo)
				req := &scheduling.Request{FairnessID: pr.id}
				for range pr.turns {
					p.PreRequest(context.Background(), nil, req, nil)
					p.ResponseComplete(context.Background(), nil, req, &scheduling.Response{})
				}
				if pr.open {
					p.PreRequest(context.Background(), nil, req, nil)
				}
				if _, err := c.Enqueue(flowcontrol.Request{ID: pr.id, FairnessID: pr.id}, arrived); err != nil {
					t.Fatal(err)
				}
			}
			clock = pick
			if it := c.Next(pick); it == nil || it.Request().FairnessID != tc.want {
				t.Fatalf("dispatched %v, want %s", it, tc.want)
			}
		})
	}
}

// Sessions of several turns share one slot, each turn asked for as the
// previous one ends: under global-strict (arrival order) every session
// advances a turn per round and all finish near the end; turn-priority
// serves the deepest first, so sessions finish one after another (llm-d's
// guide: "serving the deepest first lets sessions finish").
func TestTurnPriorityFinishesSessions(t *testing.T) {
	const sessions, turns = 8, 6
	run := func(fairness flowcontrol.FairnessPolicy, hooks *ProgramAware) (finishedHalfway int, meanDone float64) {
		c := controllerOf(t, fairness)
		clock := now
		left := map[string]int{}
		for i := range sessions {
			id := fmt.Sprint("s", i)
			left[id] = turns
			if _, err := c.Enqueue(flowcontrol.Request{ID: id, FairnessID: id}, clock.Add(time.Duration(i)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
		clock = clock.Add(time.Second)
		for step := 1; ; step++ {
			it := c.Next(clock)
			if it == nil {
				break
			}
			id := it.Request().FairnessID
			req := &scheduling.Request{FairnessID: id}
			if hooks != nil {
				hooks.PreRequest(context.Background(), nil, req, nil)
			}
			clock = clock.Add(time.Second) // one turn's service
			if hooks != nil {
				hooks.ResponseComplete(context.Background(), nil, req, &scheduling.Response{})
			}
			if left[id]--; left[id] > 0 {
				if _, err := c.Enqueue(flowcontrol.Request{ID: fmt.Sprint(id, step), FairnessID: id}, clock); err != nil {
					t.Fatal(err)
				}
				continue
			}
			meanDone += float64(step) / sessions
			if step <= sessions*turns/2 {
				finishedHalfway++
			}
		}
		return finishedHalfway, meanDone
	}
	tp := build(t, NewProgramAware, `{"strategy": "turn-priority"}`, func() time.Time { return now }).(*ProgramAware)
	fcfsHalf, fcfsMean := run(build(t, NewGlobalStrict, "", nil).(flowcontrol.FairnessPolicy), nil)
	tpHalf, tpMean := run(tp, tp)
	low := build(t, NewProgramAware, `{"strategy": "turn-priority", "turnPriorityTimeWeight": 0.05}`, func() time.Time { return now }).(*ProgramAware)
	lowHalf, lowMean := run(low, low)
	t.Logf("%d sessions × %d turns, one slot: finished by half-time global-strict %d, turn-priority %d (weight 0.05: %d); mean finish (turns served) %.1f, %.1f (%.1f)",
		sessions, turns, fcfsHalf, tpHalf, lowHalf, fcfsMean, tpMean, lowMean)
	if tpHalf <= fcfsHalf || tpMean >= fcfsMean {
		t.Errorf("turn-priority finished %d by half-time (mean %.1f), global-strict %d (mean %.1f)", tpHalf, tpMean, fcfsHalf, fcfsMean)
	}
}
