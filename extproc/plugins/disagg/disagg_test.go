package disagg_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
)

// recorder counts decisions by handler type and decision.
type recorder struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *recorder) DisaggDecision(p scheduling.TypedName, model, d string) { r.add(p.Type + " " + d) }
func (r *recorder) PDDecision(p scheduling.TypedName, model, d string)     { r.add(p.Type + " " + d) }
func (r *recorder) add(k string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[k]++
}

func build(t *testing.T, yaml string) (*config.Built, *recorder, error) {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{n: map[string]int{}}
	b, err := config.Build(c, all.Registry(), &scheduling.Handle{Services: map[string]any{disagg.ServiceRecorder: rec}}, nil)
	return b, rec, err
}

const head = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"

// profiles are role-filtered profiles named decode, prefill and encode.
const profiles = `
- type: decode-filter
- type: prefill-filter
- type: encode-filter
- type: always-disagg-pd-decider
- type: always-disagg-multimodal-decider
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
- name: encode
  plugins: [{pluginRef: encode-filter}]
`

func fleet() []*endpoints.Endpoint {
	return []*endpoints.Endpoint{
		schedtest.Endpoint("e", endpoints.Metrics{}, endpoints.RoleLabel, "encode"),
		schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill"),
		schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode"),
	}
}

func chat(content string) *scheduling.Request {
	return &scheduling.Request{ID: "r", TargetModel: "m", PromptTokens: 100,
		Body: &openai.Request{API: openai.ChatCompletions, Model: "m", Messages: []openai.Message{{Role: "user", Content: json.RawMessage(content)}}}}
}

const image = `[{"type":"text","text":"what is it?"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}]`

// schedule runs one request and returns the upstream headers it gets and
// the primary's name.
func schedule(t *testing.T, b *config.Built, req *scheduling.Request, eps []*endpoints.Endpoint) (map[string]string, string, error) {
	t.Helper()
	cs := scheduling.NewCycleState()
	res, err := b.Scheduler.Schedule(context.Background(), cs, req, eps)
	if err != nil {
		return nil, "", err
	}
	for _, h := range b.PreRequest {
		h.PreRequest(context.Background(), cs, req, res)
	}
	return res.Headers, res.Primary().Targets[0].Name(), nil
}

func TestStages(t *testing.T) {
	eps := fleet()
	tests := []struct {
		name, params string
		content      string
		eps          []*endpoints.Endpoint
		prefill      bool
		encode       bool
		decision     string
	}{
		{"E/P/D multimodal", "deciders: {prefill: always-disagg-pd-decider, encode: always-disagg-multimodal-decider}", image, eps, true, true, "encode-prefill-decode"},
		{"E/P/D text", "deciders: {prefill: always-disagg-pd-decider, encode: always-disagg-multimodal-decider}", `"hi"`, eps, true, false, "prefill-decode"},
		{"flat aliases", "prefillDeciderPluginName: always-disagg-pd-decider\n    encodeDeciderPluginName: always-disagg-multimodal-decider", image, eps, true, true, "encode-prefill-decode"},
		{"pd alias name", "deciderPluginName: always-disagg-pd-decider\n    encodeDeciderPluginName: always-disagg-multimodal-decider", `"hi"`, eps, true, false, "prefill-decode"},
		{"prefill-first", "stageOrder: Prefill_First\n    deciders: {encode: always-disagg-multimodal-decider}", image, eps, true, true, "encode-prefill-decode"},
		{"no prefill server", "deciders: {prefill: always-disagg-pd-decider, encode: always-disagg-multimodal-decider}", image, []*endpoints.Endpoint{eps[0], eps[2]}, false, true, "encode-decode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, rec, err := build(t, head+"plugins:\n- type: disagg-profile-handler\n  parameters:\n    "+tt.params+profiles)
			if err != nil {
				t.Fatal(err)
			}
			hdr, primary, err := schedule(t, b, chat(tt.content), tt.eps)
			if err != nil {
				t.Fatal(err)
			}
			if primary != "d" {
				t.Errorf("primary %s, want the decode server", primary)
			}
			if got := hdr[eppwire.HeaderPrefiller]; (got == eps[1].Address()) != tt.prefill || (got != "" && !tt.prefill) {
				t.Errorf("%s = %q, prefill %v", eppwire.HeaderPrefiller, got, tt.prefill)
			}
			if got := hdr[eppwire.HeaderEncoders]; (got == eps[0].Address()) != tt.encode || (got != "" && !tt.encode) {
				t.Errorf("%s = %q, encode %v", eppwire.HeaderEncoders, got, tt.encode)
			}
			if rec.n[disagg.Type+" "+tt.decision] != 1 || len(rec.n) != 1 {
				t.Errorf("decisions %v, want one %s", rec.n, tt.decision)
			}
		})
	}
}

// Without a decode server the request fails with the decode profile's
// error, no other stage runs and no decision is counted.
func TestDecodeFails(t *testing.T) {
	b, rec, err := build(t, head+"plugins:\n- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}}"+strings.Replace(profiles, "- name: encode\n  plugins: [{pluginRef: encode-filter}]\n", "", 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := schedule(t, b, chat(`"hi"`), fleet()[:2]); !errors.Is(err, scheduling.ErrAllFiltered) {
		t.Fatalf("got %v, want the decode profile's %v", err, scheduling.ErrAllFiltered)
	}
	if len(rec.n) != 0 {
		t.Errorf("decisions %v", rec.n)
	}
}

// The deprecated handlers load and behave as the current one; the header
// handlers set the same headers again.
func TestDeprecated(t *testing.T) {
	pd := head + `plugins:
- type: pd-profile-handler
  parameters: {deciderPluginName: always-disagg-pd-decider, prefixPluginType: prefix-cache-scorer}
- type: disagg-headers-handler
- type: prefill-header-handler
  parameters: {prefillProfile: prefill}
- type: decode-filter
- type: prefill-filter
- type: always-disagg-pd-decider
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
`
	b, rec, err := build(t, pd)
	if err != nil {
		t.Fatal(err)
	}
	hdr, _, err := schedule(t, b, chat(`"hi"`), fleet())
	if err != nil {
		t.Fatal(err)
	}
	if hdr[eppwire.HeaderPrefiller] != fleet()[1].Address() || rec.n[disagg.PDType+" prefill-decode"] != 1 {
		t.Errorf("headers %v, decisions %v", hdr, rec.n)
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct{ name, plugins, want string }{
		{"mixed forms", "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}, deciderPluginName: always-disagg-pd-decider}", "mixed"},
		{"bad order", "- type: disagg-profile-handler\n  parameters: {stageOrder: sideways}", "stageOrder"},
		{"prefill decider in prefill-first", "- type: disagg-profile-handler\n  parameters: {stageOrder: prefill-first, deciders: {prefill: always-disagg-pd-decider}}", "no decider"},
		{"missing decider", "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: nothing}}", `"nothing" is not a configured plugin`},
		{"not a decider", "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: decode-filter}}", "not a disaggregation decider"},
		{"unknown field", "- type: disagg-profile-handler\n  parameters: {decider: x}", "unknown field"},
		{"never-run profile", "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}}", `profile "encode" never runs`},
		{"primaryPort", "- type: pd-profile-handler\n  parameters: {deciderPluginName: always-disagg-pd-decider, primaryPort: 8000}", "primaryPort"},
		{"pd without decider", "- type: pd-profile-handler\n  parameters: {deciderPluginName: always-disagg-pd-decider, prefixMatchInfoProducerName: queue-scorer}", "is not a prefix-match producer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := build(t, head+"plugins:\n"+tt.plugins+"\n- type: queue-scorer"+profiles)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
	// A decider for a stage without its profile.
	_, _, err := build(t, head+"plugins:\n- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}}\n- type: always-disagg-pd-decider\n- type: decode-filter\nschedulingProfiles:\n- name: decode\n  plugins: [{pluginRef: decode-filter}]\n")
	if err == nil || !strings.Contains(err.Error(), `no prefill profile "prefill"`) {
		t.Fatalf("got %v", err)
	}
}

func TestParseStageOrder(t *testing.T) {
	for in, want := range map[string]disagg.StageOrder{"": disagg.DecodeFirst, "decode": disagg.DecodeFirst, "DECODE_FIRST": disagg.DecodeFirst,
		"decodefirst": disagg.DecodeFirst, "prefill": disagg.PrefillFirst, "Prefill-First": disagg.PrefillFirst, "prefill_first": disagg.PrefillFirst} {
		if got, err := disagg.ParseStageOrder(in); err != nil || got != want {
			t.Errorf("ParseStageOrder(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := disagg.ParseStageOrder("encode-first"); err == nil {
		t.Error("encode-first accepted")
	}
}

func FuzzParseStageOrder(f *testing.F) {
	for _, s := range []string{"decode-first", "Prefill_First", "", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := disagg.ParseStageOrder(s)
		if err == nil && o != disagg.DecodeFirst && o != disagg.PrefillFirst {
			t.Fatalf("%q parsed as %q", s, o)
		}
		if err != nil && o != "" {
			t.Fatalf("%q: %q with error %v", s, o, err)
		}
	})
}

// The handler publishes the earlier stage's pick (disagg.PeerKey, llm-d's
// peer-endpoint attribute) for the later stage's topology affinity: the
// decode pick while the prefill profile runs (decode-first), the prefill
// pick while the decode profile runs (prefill-first).
func TestPeerPublished(t *testing.T) {
	host := func(name, role, h string) *endpoints.Endpoint {
		return schedtest.Endpoint(name, endpoints.Metrics{}, endpoints.RoleLabel, role, "kubernetes.io/hostname", h)
	}
	const topo = `
- type: topology-extractor
- type: endpoint-notification-source
- type: topology-affinity-filter
- type: prefill-filter
- type: decode-filter
- type: always-disagg-pd-decider
dataLayer:
  sources: [{pluginRef: endpoint-notification-source, extractors: [{pluginRef: topology-extractor}]}]
`
	tests := []struct {
		name, params, profiles string
		eps                    []*endpoints.Endpoint
		prefill, decode        string
	}{
		{"decode-first places prefill near decode", "deciders: {prefill: always-disagg-pd-decider}", `
- name: decode
  plugins: [{pluginRef: decode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: topology-affinity-filter}]
`, []*endpoints.Endpoint{host("p1", "prefill", "h1"), host("p2", "prefill", "h2"), host("d2", "decode", "h2")}, "p2", "d2"},
		{"prefill-first places decode near prefill", "stageOrder: prefill-first", `
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: topology-affinity-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
`, []*endpoints.Endpoint{host("p2", "prefill", "h2"), host("d1", "decode", "h1"), host("d2", "decode", "h2")}, "p2", "d2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _, err := build(t, head+"plugins:\n- type: disagg-profile-handler\n  parameters: {"+tt.params+"}"+topo+"schedulingProfiles:"+tt.profiles)
			if err != nil {
				t.Fatal(err)
			}
			for range 20 { // random tie-breaks would pick the far server half the time
				hdr, primary, err := schedule(t, b, chat(`"hi"`), tt.eps)
				if err != nil {
					t.Fatal(err)
				}
				var prefill string
				for _, e := range tt.eps {
					if e.Address() == hdr[eppwire.HeaderPrefiller] {
						prefill = e.Name()
					}
				}
				if prefill != tt.prefill || primary != tt.decode {
					t.Fatalf("prefill %q, decode %q; want %q, %q", prefill, primary, tt.prefill, tt.decode)
				}
			}
		})
	}
}
