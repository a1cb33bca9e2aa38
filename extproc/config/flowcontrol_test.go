package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

var apiVersionLine = regexp.MustCompile(`(?m)^apiVersion: .*$`)

// loadGuide builds a guide's file. The guides use apiVersions
// (llm-d.ai/v1, config.x-k8s.io/v1alpha1) whose acceptance belongs to
// Parse's apiVersion handling, not to the flowControl section: when Parse
// refuses the file's own, it is built under llm-d.ai/v1alpha1 instead.
func loadGuide(t *testing.T, name string) *Built {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "flowcontrol", name))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil && strings.Contains(err.Error(), "apiVersion") {
		c, err = Parse(apiVersionLine.ReplaceAll(data, []byte("apiVersion: "+APIVersionLLM)))
	}
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b, err := Build(c, all.Registry(), &scheduling.Handle{Now: func() time.Time { return now }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.FlowControl == nil {
		t.Fatal("flow control not built")
	}
	return b
}

type fleet struct{ eps []*endpoints.Endpoint }

func (f *fleet) Candidates() []*endpoints.Endpoint { return f.eps }

func newFleet(n int) *fleet {
	f := &fleet{}
	for i := range n {
		e := endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint("p", i), Address: fmt.Sprintf("10.1.0.%d:8000", i+1)})
		e.SetMetrics(&endpoints.Metrics{UpdateTime: time.Now()})
		f.eps = append(f.eps, e)
	}
	return f
}

// run charges n requests on each endpoint, as routed requests do.
func (f *fleet) run(n int) []endpoints.Charge {
	var cs []endpoints.Charge
	for _, e := range f.eps {
		for range n {
			cs = append(cs, e.Charge(0, 100, 200, 200))
		}
	}
	return cs
}

func flowOutcome(err error) flowcontrol.Outcome {
	var fe *flowcontrol.Error
	if errors.As(err, &fe) {
		return fe.Outcome
	}
	return flowcontrol.Dispatched
}

func TestFlowControlGuideConfigs(t *testing.T) {
	tests := []struct {
		file        string
		detector    string
		maxRequests int64
		maxBytes    int64
		ttl         time.Duration
		bands       map[int]int64 // priority → maxRequests
		fairness    string
		usageLimit  string
		eviction    bool
	}{
		{"llm-d-flow-control-guide.yaml", flowpolicy.ConcurrencyType, 1000, 10 << 30, time.Minute,
			map[int]int64{100: 500, 0: 200, -10: 50}, flowpolicy.RoundRobinType, flowpolicy.StaticLimitType, false},
		{"llm-d-priority-holdback.yaml", flowpolicy.ConcurrencyType, 1000, 10 << 30, 300 * time.Second,
			map[int]int64{100: 500, 60: 500, 30: 500, 10: 500, -5: 500, -10: 500}, flowpolicy.RoundRobinType, flowpolicy.HoldbackType, false},
		{"llm-d-priority-evictable.yaml", flowpolicy.ConcurrencyType, 1000, 10 << 30, 300 * time.Second,
			map[int]int64{100: 500, 60: 500, 30: 500, 10: 500, -5: 500, -10: 500}, flowpolicy.RoundRobinType, flowpolicy.StaticLimitType, true},
		{"llm-d-router-soft-reflective.yaml", flowpolicy.UtilizationType, 0, 0, time.Minute,
			map[int]int64{}, flowpolicy.GlobalStrictType, flowpolicy.SoftReflectType, false},
		{"llm-d-router-program-aware.yaml", flowpolicy.UtilizationType, 0, 0, time.Minute,
			map[int]int64{}, flowpolicy.ProgramAwareType, flowpolicy.StaticLimitType, false},
		{"gie-flow-control-guide.yaml", flowpolicy.UtilizationType, 0, 1_000_000_000, 30 * time.Second,
			map[int]int64{100: 0}, flowpolicy.GlobalStrictType, flowpolicy.StaticLimitType, false},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			b := loadGuide(t, tc.file)
			cfg := b.FlowControl.Config
			if cfg.DetectorName != tc.detector || cfg.MaxRequests != tc.maxRequests || cfg.MaxBytes != tc.maxBytes ||
				cfg.RequestTTL != tc.ttl || cfg.NoEndpointTTL != tc.ttl || cfg.EnableEviction != tc.eviction {
				t.Errorf("config %+v", cfg)
			}
			if got := cfg.UsageLimit.(scheduling.Plugin).TypedName().Type; got != tc.usageLimit {
				t.Errorf("usage limit %s, want %s", got, tc.usageLimit)
			}
			if len(cfg.Bands) != len(tc.bands) {
				t.Fatalf("%d bands, want %d", len(cfg.Bands), len(tc.bands))
			}
			defFairness := flowpolicy.GlobalStrictType
			if tc.fairness == flowpolicy.ProgramAwareType {
				defFairness = tc.fairness
			}
			if got := cfg.DefaultBand.Fairness.(scheduling.Plugin).TypedName().Type; got != defFairness {
				t.Errorf("default band fairness %s, want %s", got, defFairness)
			}
			for _, bc := range cfg.Bands {
				if want, ok := tc.bands[bc.Priority]; ok && bc.MaxRequests != want {
					t.Errorf("band %d maxRequests %d, want %d", bc.Priority, bc.MaxRequests, want)
				}
				if got := bc.Fairness.(scheduling.Plugin).TypedName().Type; got != tc.fairness {
					t.Errorf("band %d fairness %s, want %s", bc.Priority, got, tc.fairness)
				}
				if got := bc.Ordering.(scheduling.Plugin).TypedName().Type; got != flowpolicy.FCFSType {
					t.Errorf("band %d ordering %s", bc.Priority, got)
				}
			}
		})
	}
}

// The flow-control guide: premium, standard and best-effort tiers; a burst
// of best-effort requests is buffered in its band (not shed as without
// flow control) up to the band's 50, then rejected; dispatch holds while
// the pool is at maxConcurrency per server and resumes in strict priority
// order, tenants of a band taking turns.
func TestFlowControlGuideBehaves(t *testing.T) {
	b := loadGuide(t, "llm-d-flow-control-guide.yaml")
	pool := newFleet(2)
	c, err := flowcontrol.New(b.FlowControl.Config, flowcontrol.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	running := pool.run(132) // every server at maxConcurrency
	now := time.Now()
	enqueue := func(id, tenant string, prio int) error {
		_, err := c.Enqueue(flowcontrol.Request{ID: id, FairnessID: tenant, Priority: prio, Bytes: 200}, now)
		return err
	}
	for i := range 60 {
		err := enqueue(fmt.Sprint("be", i), "tenant-b", -10)
		if want := map[bool]flowcontrol.Outcome{true: flowcontrol.RejectedCapacity, false: flowcontrol.Dispatched}[i >= 50]; flowOutcome(err) != want {
			t.Fatalf("best-effort %d: %v", i, err)
		}
	}
	for i, tenant := range []string{"a", "a", "a", "b"} {
		if err := enqueue(fmt.Sprint("std-", tenant, i), tenant, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := enqueue("premium", "a", 100); err != nil {
		t.Fatal(err)
	}
	if it := c.Next(now); it != nil {
		t.Fatalf("dispatched %s at maxConcurrency", it.Request().ID)
	}
	// Capacity for six: one request frees per dispatch, as each
	// dispatched request is charged in turn.
	running[0].Release()
	var order []string
	for range 6 {
		it := c.Next(now)
		if it == nil {
			t.Fatal("nothing dispatched with room")
		}
		order = append(order, it.Request().ID)
		pool.eps[0].Charge(0, 1, 1, 1)
		running[len(order)].Release()
	}
	want := "premium std-a0 std-b3 std-a1 std-a2 be0"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("order %q, want %q", got, want)
	}
}

// The priority guide with holdback: ceilings 1.0 … 0.5 by rank over the
// six bands; with the pool at 65% of maxConcurrency, the bands whose
// ceiling is at or below it (-5: 0.6, -10: 0.5) wait, the others run.
func TestPriorityHoldbackGuideBehaves(t *testing.T) {
	b := loadGuide(t, "llm-d-priority-holdback.yaml")
	pool := newFleet(2)
	c, err := flowcontrol.New(b.FlowControl.Config, flowcontrol.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	pool.eps[0].Charge(0, 1, 1, 1) // 13 of 20 in flight: saturation 0.65
	pool.run(6)
	now := time.Now()
	for _, p := range []int{-10, -5, 10, 30, 60, 100} {
		if _, err := c.Enqueue(flowcontrol.Request{ID: fmt.Sprint(p), FairnessID: "f", Priority: p}, now); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for it := c.Next(now); it != nil; it = c.Next(now) {
		got = append(got, it.Request().ID)
	}
	if strings.Join(got, " ") != "100 60 30 10" {
		t.Errorf("dispatched %v, want the four bands above 0.65", got)
	}
	if c.Len() != 2 {
		t.Errorf("%d left queued, want the two sheddable bands", c.Len())
	}
}

// The priority guide with eviction: a realtime request blocked by a pool
// full of sheddable work revokes the lowest-priority one in flight.
func TestPriorityEvictableGuideBehaves(t *testing.T) {
	b := loadGuide(t, "llm-d-priority-evictable.yaml")
	pool := newFleet(1)
	c, err := flowcontrol.New(b.FlowControl.Config, flowcontrol.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var revoked []string
	for i, p := range []int{-5, -10, -5, -5, -5, -5, -5, -5, -5, -5} {
		if _, err := c.Enqueue(flowcontrol.Request{ID: fmt.Sprint("async", i), FairnessID: "f", Priority: p}, now); err != nil {
			t.Fatal(err)
		}
		it := c.Next(now)
		if it == nil {
			t.Fatalf("async %d not dispatched below maxConcurrency", i)
		}
		pool.eps[0].Charge(0, 1, 1, 1)
		id := it.Request().ID
		c.Track(it, now, func() { revoked = append(revoked, id) })
	}
	if _, err := c.Enqueue(flowcontrol.Request{ID: "interactive", FairnessID: "f", Priority: 100}, now); err != nil {
		t.Fatal(err)
	}
	if it := c.Next(now); it != nil {
		t.Fatal("dispatched into a full pool")
	}
	if strings.Join(revoked, " ") != "async1" {
		t.Errorf("revoked %v, want the priority -10 request", revoked)
	}
}

func TestFlowControlSectionErrors(t *testing.T) {
	head := "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n"
	tests := []struct{ name, yaml, want string }{
		{"unknown field", "flowControl:\n  maxRequest: 5\n", `unknown field "maxRequest"`},
		{"unknown band field", "flowControl:\n  priorityBands:\n  - priority: 1\n    ttl: 5s\n", `unknown field "ttl"`},
		{"band without priority", "flowControl:\n  priorityBands:\n  - maxRequests: 5\n", "priorityBands[0].priority is required"},
		{"duplicate band", "flowControl:\n  priorityBands:\n  - priority: 1\n  - priority: 1\n", "priority 1 is configured twice"},
		{"bad quantity", "flowControl:\n  maxBytes: lots\n", "quantity"},
		{"bad TTL", "flowControl:\n  defaultRequestTTL: soon\n", `invalid duration "soon"`},
		{"negative TTL", "flowControl:\n  defaultRequestTTL: -1s\n", "flowControl.defaultRequestTTL must not be negative"},
		{"negative no-endpoint TTL", "flowControl:\n  noEndpointRequestTTL: -2s\n", "flowControl.noEndpointRequestTTL must not be negative"},
		{"ref of the wrong kind", "plugins:\n- type: queue-scorer\nflowControl:\n  priorityBands:\n  - priority: 1\n    fairnessPolicyRef: queue-scorer\n", `"queue-scorer" (type "queue-scorer") is not a fairness policy`},
		{"unknown ref", "flowControl:\n  usageLimitPolicyPluginRef: nope\n", `usageLimitPolicyPluginRef: "nope" is neither a configured plugin nor a plugin type`},
		{"unknown detector field", "saturationDetector:\n  pluginRef: concurrency-detector\n  headroom: 1\n", `unknown field "headroom"`},
		// A detector plugin has its own parameters: GIE's thresholds beside
		// its reference would be ignored.
		{"detector ref with legacy thresholds", "saturationDetector:\n  pluginRef: concurrency-detector\n  queueDepthThreshold: 3\n", "saturationDetector.queueDepthThreshold"},
		{"flow-control detector with legacy thresholds", "saturationDetector:\n  kvCacheUtilThreshold: 0.5\nflowControl:\n  saturationDetector: {pluginRef: concurrency-detector}\n", "saturationDetector.kvCacheUtilThreshold"},
		{"two detectors", "saturationDetector:\n  pluginRef: utilization-detector\nflowControl:\n  saturationDetector: {pluginRef: concurrency-detector}\n", `flowControl.saturationDetector.pluginRef: "concurrency-detector" and saturationDetector.pluginRef: "utilization-detector"`},
		{"holdback without minCeiling", "plugins:\n- type: priority-holdback-policy\nflowControl:\n  usageLimitPolicyPluginRef: priority-holdback-policy\n", "minCeiling is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(t, head+tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// probabilistic-admitter measures a saturation of its own to shed by, but
// llm-d has it as an admitter only: named as the saturation detector, in
// either place and with the gate on or off, it is refused by name (it
// would otherwise gate dispatch and, built by the reference, shed too).
func TestDetectorRefusesAdmitter(t *testing.T) {
	const head = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
	const declared = "plugins:\n- type: probabilistic-admitter\n  name: shed\n"
	tests := []struct{ name, yaml, want string }{
		{"flowControl detector", "featureGates: [flowControl]\n" + declared + "flowControl:\n  saturationDetector: {pluginRef: shed}\n",
			`flowControl.saturationDetector.pluginRef: "shed" (type "probabilistic-admitter") is not a saturation detector`},
		{"top-level detector", "featureGates: [flowControl]\n" + declared + "saturationDetector:\n  pluginRef: shed\n",
			`saturationDetector.pluginRef: "shed" (type "probabilistic-admitter") is not a saturation detector`},
		{"top-level detector, gate off", declared + "saturationDetector:\n  pluginRef: shed\n",
			`saturationDetector.pluginRef: "shed" (type "probabilistic-admitter") is not a saturation detector`},
		{"detector by type, not declared", "featureGates: [flowControl]\nflowControl:\n  saturationDetector: {pluginRef: probabilistic-admitter}\n",
			`"probabilistic-admitter" (type "probabilistic-admitter") is not a saturation detector`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(t, head+tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	// As an admitter it is accepted.
	if _, err := build(t, head+declared); err != nil {
		t.Fatal(err)
	}
}

func TestFlowControlGateOff(t *testing.T) {
	b, err := build(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: concurrency-detector\n  parameters: {maxConcurrency: 4}\nsaturationDetector:\n  pluginRef: concurrency-detector\nflowControl:\n  maxBytes: \"1024\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if b.FlowControl != nil || !b.FlowControlIgnored {
		t.Errorf("flow control %v, ignored %v", b.FlowControl, b.FlowControlIgnored)
	}
	// Without flow control the named detector is the shedding test.
	if b.Detector == nil || b.Detector.(scheduling.Plugin).TypedName().Type != flowpolicy.ConcurrencyType {
		t.Errorf("detector %v", b.Detector)
	}
	if _, err := build(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nflowControl:\n  maxByte: 1\n"); err == nil {
		t.Error("a misspelt field is refused with the gate off too")
	}
}

// A flowControl section never panics the loader: it builds or is refused.
func FuzzFlowControlSection(f *testing.F) {
	for _, name := range []string{"llm-d-flow-control-guide.yaml", "llm-d-priority-holdback.yaml", "gie-flow-control-guide.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", "flowcontrol", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(apiVersionLine.ReplaceAll(data, []byte("apiVersion: "+APIVersionLLM)))
	}
	f.Add([]byte("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\nflowControl:\n  maxBytes: -1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		b, err := Build(c, all.Registry(), &scheduling.Handle{Now: time.Now}, nil)
		if err == nil && b.FlowControl != nil {
			if err := b.FlowControl.Config.Validate(); err != nil {
				t.Fatalf("built an invalid configuration: %v", err)
			}
		}
	})
}
