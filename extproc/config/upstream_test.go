package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/headerfilter"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics/peertest"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

// upstreamDoc is what the test needs to know of an upstream file before
// loading it: the plugin types and the sections it uses.
type upstreamDoc struct {
	APIVersion string `json:"apiVersion"`
	Plugins    []struct {
		Type string `json:"type"`
	} `json:"plugins"`
	FlowControl  any      `json:"flowControl"`
	FeatureGates []string `json:"featureGates"`
}

// invalidUpstream are upstream documents that are themselves wrong, with
// the error they must fail with: a typo, not a gap in kvgate.
var invalidUpstream = map[string]string{
	// "- -pluginRef" in GIE v1.0's configuration guide.
	"gateway-api-inference-extension-v1-0-0-site-src-guides-epp-configuration-config-text-3.yaml": `unknown field "-pluginRef"`,
	// "  -pluginRef" in GIE v1.1 to v1.3's configuration guide: a key of the
	// profile, not a list item.
	"gateway-api-inference-extension-v1-3-1-site-src-guides-epp-configuration-config-text-3.yaml": `unknown field "-pluginRef"`,
	// llm-d v0.6 and v0.8's architecture guide shows the P/D plugins without
	// the apiVersion line, which llm-d's loader requires as kvgate does.
	"llm-d-router-v0-6-1-docs-architecture-3.yaml": "apiVersion must be one of",
	"llm-d-router-v0-8-0-docs-architecture-3.yaml": "apiVersion must be one of",
	// llm-d v0.6's P/D samples are envsubst templates: primaryPort is
	// "${PRIMARY_PORT}" until deployed (and kvgate refuses primaryPort by name).
	"llm-d-router-v0-6-1-deploy-config-pd-epp-config-1.yaml":     "PDParams.primaryPort of type int",
	"llm-d-router-v0-6-1-deploy-config-sim-pd-epp-config-1.yaml": "PDParams.primaryPort of type int",
	// The tuning guide's template: maxConcurrency is "<N_active + B>", for the
	// reader to fill in.
	"llm-d-guides-flow-control-tuning-1.yaml": "cannot unmarshal string",
	// mm-embeddings-cache-producer has no cacheSizeInMB (its parameter is
	// cacheSizeInMBPerServer): llm-d ignores the field, kvgate names it.
	"llm-d-router-deploy-config-epp-mm-embeddings-cache-config-1.yaml": `unknown field "cacheSizeInMB"`,
	// Not an upstream mistake but a kvgate gap: a band's own
	// defaultRequestTTL (flowcontrol.go's band fields, the controller's single
	// TTL). Corrected below without it, the guide's turn-priority loads.
	"llm-d-guides-turn-priority-fairness-router-turn-priority-fairness-values-1.yaml": `unknown field "defaultRequestTTL"`,
}

// upstreamFixes correct the invalid upstream documents whose intent is
// plain; corrected, they must load and run.
var upstreamFixes = map[string][2]string{
	"gateway-api-inference-extension-v1-0-0-site-src-guides-epp-configuration-config-text-3.yaml": {"  -pluginRef:", "  - pluginRef:"},
	"gateway-api-inference-extension-v1-3-1-site-src-guides-epp-configuration-config-text-3.yaml": {"  -pluginRef:", "  - pluginRef:"},
	"llm-d-router-deploy-config-epp-mm-embeddings-cache-config-1.yaml":                            {"cacheSizeInMB:", "cacheSizeInMBPerServer:"},
	// The guide's reader fills in N_active + B; any count will do.
	"llm-d-guides-flow-control-tuning-1.yaml":                                         {"maxConcurrency: <N_active + B>", "maxConcurrency: 96"},
	"llm-d-guides-turn-priority-fairness-router-turn-priority-fairness-values-1.yaml": {`    defaultRequestTTL: "9000s"` + "\n", ""},
}

func TestUpstreamFixed(t *testing.T) {
	for file, fix := range upstreamFixes {
		data, err := os.ReadFile(filepath.Join("testdata", "upstream", file))
		if err != nil {
			t.Fatal(err)
		}
		fixed := strings.ReplaceAll(string(data), fix[0], fix[1])
		if fixed == string(data) {
			t.Fatalf("%s: %q not found", file, fix[0])
		}
		if _, err := loadAndRun([]byte(fixed), all.Registry()); err != nil {
			t.Errorf("%s, corrected: %v", file, err)
		}
	}
}

// upstreamFiles are files the upstream documents name that a plugin reads
// when built (a CA bundle): each such path is replaced by a test file of
// the same kind (the function writes it and returns its path).
var upstreamFiles = map[string]func(tb testing.TB) string{
	"/etc/epp/tls/ca.crt": func(tb testing.TB) string {
		cert, _ := testutil.SelfSignedCert(tb)
		return peertest.CAFile(tb, cert)
	},
}

// withUpstreamFiles is data with the paths of upstreamFiles it names
// pointing at test files.
func withUpstreamFiles(t *testing.T, data []byte) []byte {
	for path, content := range upstreamFiles {
		if !strings.Contains(string(data), path) {
			continue
		}
		data = []byte(strings.ReplaceAll(string(data), path, content(t)))
	}
	return data
}

// minUpstreamLoaded is how many of the upstream documents load: fewer is a
// regression. (More: raise it.)
const minUpstreamLoaded = 127

// outcome of loading one upstream file.
type outcome struct {
	file, reason string
	loaded       bool
}

// TestUpstreamConfigs loads every EndpointPickerConfig collected from the
// GIE and llm-d charts, guides, docs and test data (testdata/upstream; the
// first line of each names its source). A file whose plugins kvgate all
// registers, and that uses no section kvgate refuses, must load and build
// a scheduler that picks an endpoint, unless a plugin refuses a parameter
// by name (scheduling.UnsupportedParameterError); any other file must fail
// with an error naming a missing plugin type or the refused section. The list of
// outcomes and the counts by reason are logged (go test -v).
func TestUpstreamConfigs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "upstream", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no upstream configs: %v", err)
	}
	reg := all.Registry()
	registered := reg.Types()
	var outcomes []outcome
	unseen := map[string]bool{}
	for f := range disaggregated {
		unseen[f] = true
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(data), "# source: ") {
			t.Errorf("%s: first line must name the source", f)
		}
		data = withUpstreamFiles(t, data)
		var doc upstreamDoc
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var missing []string
		for _, p := range doc.Plugins {
			if !slices.Contains(registered, p.Type) && !slices.Contains(missing, p.Type) {
				missing = append(missing, p.Type)
			}
		}
		var refused []string
		if !slices.Contains(APIVersions, doc.APIVersion) {
			refused = append(refused, doc.APIVersion)
		}
		for _, g := range doc.FeatureGates {
			if !featureGates[g] {
				refused = append(refused, g)
			}
		}
		o := outcome{file: filepath.Base(f)}
		headers, buildErr := loadAndRun(data, reg)
		if want, ok := disaggregated[o.file]; ok {
			delete(unseen, o.file)
			if buildErr != nil {
				t.Errorf("%s: %v", o.file, buildErr)
			} else if !equalHeaders(headers, want) {
				t.Errorf("%s: P/D headers %v, want %v", o.file, headers, want)
			}
		}
		switch {
		case buildErr == nil:
			o.loaded, o.reason = true, "loaded"
			if len(missing) > 0 || len(refused) > 0 {
				t.Errorf("%s loaded though it names %v %v", o.file, missing, refused)
			}
		case invalidUpstream[o.file] != "" && strings.Contains(buildErr.Error(), invalidUpstream[o.file]):
			o.reason = "invalid-upstream: " + invalidUpstream[o.file]
		case len(missing) == 0 && len(refused) == 0 && errors.As(buildErr, new(*scheduling.UnsupportedParameterError)):
			// A parameter kvgate knows and refuses by name.
			o.reason = reason(buildErr)
		case len(missing) == 0 && len(refused) == 0:
			t.Errorf("%s names only kvgate's plugins and sections but fails: %v", o.file, buildErr)
			o.reason = "BUG: " + buildErr.Error()
		default:
			named := false
			for _, n := range missing {
				named = named || strings.Contains(buildErr.Error(), fmt.Sprintf("%q", n))
			}
			for _, n := range refused {
				named = named || strings.Contains(buildErr.Error(), n)
			}
			if !named {
				t.Errorf("%s: error does not name any of %v %v: %v", o.file, missing, refused, buildErr)
			}
			o.reason = reason(buildErr)
		}
		outcomes = append(outcomes, o)
	}
	for f := range unseen {
		t.Errorf("%s: listed in disaggregated but not in testdata/upstream", f)
	}
	counts := map[string]int{}
	loaded := 0
	for _, o := range outcomes {
		t.Logf("%-8s %-95s %s", map[bool]string{true: "LOADED", false: "REFUSED"}[o.loaded], o.file, o.reason)
		if o.loaded {
			loaded++
		} else {
			counts[firstWord(o.reason)]++
		}
	}
	t.Logf("upstream configs: %d of %d load", loaded, len(outcomes))
	if loaded < minUpstreamLoaded {
		t.Errorf("%d upstream configs load, %d did before: a regression", loaded, minUpstreamLoaded)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return counts[keys[i]] > counts[keys[j]] || (counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j])
	})
	for _, k := range keys {
		t.Logf("  refused, %-40s %d", k, counts[k])
	}
}

// Roles of the fleet loadAndRun schedules on.
const (
	encoder   = "10.0.0.1:8000"
	prefiller = "10.0.0.2:8000"
)

// disaggregated are the upstream P/D, E/P/D and P2P documents with the
// disaggregation headers their decision must carry for loadAndRun's
// request (a long multimodal chat prompt nothing caches) on its fleet (two
// decode servers, a prefill and an encode server): "P" the prefill
// server's address in x-prefiller-host-port, "E" the encode server's in
// x-encoder-hosts-ports. Every listed document must load.
var disaggregated = map[string]map[string]string{
	"llm-d-router-deploy-config-pd-epp-config-1.yaml":                                            {"P": prefiller},
	"llm-d-router-deploy-config-sim-pd-epp-config-1.yaml":                                        {"P": prefiller},
	"llm-d-router-deploy-config-sim-e-p-d-epp-config-1.yaml":                                     {"E": encoder}, // no prefix producer: the prefill decider keeps it local
	"llm-d-router-deploy-config-sim-e-pd-epp-config-1.yaml":                                      {"E": encoder},
	"llm-d-router-docs-disaggregation-1.yaml":                                                    {"P": prefiller},
	"llm-d-router-docs-disaggregation-2.yaml":                                                    {"P": prefiller, "E": encoder},
	"llm-d-inference-scheduler-deploy-config-pd-epp-config-1.yaml":                               {"P": prefiller},
	"llm-d-inference-scheduler-deploy-config-sim-pd-epp-config-1.yaml":                           {"P": prefiller},
	"llm-d-inference-scheduler-deploy-config-sim-e-p-d-epp-config-1.yaml":                        {"E": encoder}, // likewise
	"llm-d-inference-scheduler-docs-disaggregation-1.yaml":                                       {"P": prefiller},
	"llm-d-inference-scheduler-docs-disaggregation-2.yaml":                                       {"P": prefiller, "E": encoder},
	"llm-d-guides-pd-disaggregation-router-pd-disaggregation-values-1.yaml":                      {"P": prefiller},
	"llm-d-guides-wide-ep-lws-router-wide-ep-lws-values-1.yaml":                                  {"P": prefiller},
	"llm-d-guides-agentic-serving-router-agentic-serving-gpu-values-1.yaml":                      {"P": prefiller},
	"llm-d-guides-multimodal-serving-e-disaggregation-router-e-pd-disaggregation-values-1.yaml":  {"E": encoder},
	"llm-d-guides-multimodal-serving-e-disaggregation-router-e-p-d-disaggregation-values-1.yaml": {"P": prefiller, "E": encoder},
	"llm-d-router-deploy-config-pd-topology-epp-config-1.yaml":                                   {"P": prefiller},
	"llm-d-router-pkg-epp-framework-plugins-requestcontrol-dataproducer-p2psource-readme-1.yaml": {},
}

func equalHeaders(got map[string]string, want map[string]string) bool {
	return got[eppwire.HeaderPrefiller] == want["P"] && got[eppwire.HeaderEncoders] == want["E"]
}

// loadAndRun parses and builds a configuration with every service a picker
// offers, and schedules one request with it, returning the headers the
// decision sets upstream.
func loadAndRun(data []byte, reg *scheduling.Registry) (map[string]string, error) {
	c, err := Parse(data)
	if err != nil {
		return nil, err
	}
	h := &scheduling.Handle{Services: precise.WithKVIndex(nil, kvindex.New(kvindex.Config{}))}
	b, err := Build(c, reg, h, nil)
	if err != nil {
		return nil, err
	}
	// Decode-role endpoints first, so that decode-filter and the label
	// filters of the upstream examples (llm-d.ai/role or role = decode)
	// keep them; a prefill and an encode server for the P/D documents.
	// They are one DisaggregatedSet revision, for the rollout screener's
	// coverage (it refuses servers of no revision, as llm-d's does).
	role := func(name, addr, r string, m endpoints.Metrics) *endpoints.Endpoint {
		e := endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: addr, Labels: map[string]string{"llm-d.ai/role": r, "role": r,
			"disaggregatedset.x-k8s.io/name": "my-set", "disaggregatedset.x-k8s.io/revision": "rev-a", "disaggregatedset.x-k8s.io/role": r}})
		e.SetMetrics(&m)
		return e
	}
	eps := []*endpoints.Endpoint{
		role("a", "10.0.0.3:8000", "decode", endpoints.Metrics{WaitingQueueSize: 3}),
		role("b", "10.0.0.4:8000", "decode", endpoints.Metrics{}),
		role("p", prefiller, "prefill", endpoints.Metrics{}),
		role("e", encoder, "encode", endpoints.Metrics{}),
	}
	text := strings.Repeat("Describe the picture in detail, please. ", 200)
	chat := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + text +
		`"},{"type":"image_url","image_url":{"url":"http://example.com/a.png"}}]}]}`
	// The conformance filter (header-based-testing-filter) keeps the
	// endpoints its header names: the decode servers.
	req := &scheduling.Request{ID: "r", IncomingModel: "m", TargetModel: "m", PromptTokens: len(text) / 4,
		Headers: map[string]string{headerfilter.Header: eps[0].Address() + "," + eps[1].Address()}}
	if slices.ContainsFunc(c.Plugins, func(p PluginSpec) bool { return p.Type == "token-producer" }) {
		// Not through the parsers: they would ask the configuration's
		// vLLM URL, localhost:8000, for the tokens.
		if req.Body, err = openai.Parse(openai.ChatCompletions, []byte(chat)); err != nil {
			return nil, err
		}
	} else {
		// The body goes through the configured parsers: the first of these
		// APIs they claim, the multimodal chat first.
		samples := append([]struct{ path, body string }{{"/v1/chat/completions", chat}}, sampleRequests...)
		for _, r := range samples {
			parsed, err := b.Parsers.Parse(r.path, []byte(r.body))
			if errors.Is(err, parsers.ErrUnclaimed) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("parsing %s: %w", r.path, err)
			}
			req.Body = parsed
			break
		}
	}
	cs := scheduling.NewCycleState()
	res, err := b.Scheduler.Schedule(context.Background(), cs, req, eps)
	if err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	if res.Primary() == nil || len(res.Primary().Targets) == 0 {
		return nil, errors.New("schedule: no target")
	}
	for _, hook := range b.PreRequest {
		hook.PreRequest(context.Background(), cs, req, res)
	}
	return res.Headers, nil
}

// sampleRequests are requests of the APIs the parsers claim.
var sampleRequests = []struct{ path, body string }{
	{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
	{"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`},
	{"/inference/v1/generate", `{"token_ids":[1,2,3]}`},
	{"/v1/models", ``},
	// vLLM's gRPC Generate: tokenized input_ids 1, 2, 3 (packed), framed.
	{"/vllm.grpc.engine.VllmEngine/Generate", "\x00\x00\x00\x00\x07\x12\x05\x12\x03\x01\x02\x03"},
}

// reason classifies a refusal: the missing feature, or the unknown plugin.
func reason(err error) string {
	var u *UnsupportedError
	var unknown *scheduling.UnknownTypeError
	var param *scheduling.UnsupportedParameterError
	switch {
	case errors.As(err, &param):
		return "unsupported-parameter: " + param.Param
	case errors.As(err, &u):
		return strings.ReplaceAll(u.Feature, " ", "-") + ": " + u.Name
	case errors.As(err, &unknown):
		return "unknown-plugin: " + unknown.Type
	}
	return "error: " + err.Error()
}

func firstWord(s string) string {
	w, _, _ := strings.Cut(s, ":")
	return w
}

// buildUpstream parses and builds one document of the upstream corpus.
func buildUpstream(t *testing.T, file string) *Built {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "upstream", file))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(c, all.Registry(), &scheduling.Handle{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTopologyNearDecode: llm-d's P/D topology config places the prefill
// on the decode pick's host, though another prefill server is idler.
func TestTopologyNearDecode(t *testing.T) {
	b := buildUpstream(t, "llm-d-router-deploy-config-pd-topology-epp-config-1.yaml")
	server := func(name, role, host string, waiting int) *endpoints.Endpoint {
		e := endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: name + ":8000",
			Labels: map[string]string{"llm-d.ai/role": role, "kubernetes.io/hostname": host}})
		e.SetMetrics(&endpoints.Metrics{WaitingQueueSize: waiting})
		return e
	}
	eps := []*endpoints.Endpoint{
		server("decode-busy", "decode", "node-1", 5),
		server("decode", "decode", "node-2", 0),
		server("prefill-near", "prefill", "node-2", 3),
		server("prefill-idle", "prefill", "node-3", 0),
	}
	body, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"`+strings.Repeat("a long prompt nothing caches ", 100)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req := &scheduling.Request{ID: "r", TargetModel: "m", Body: body, PromptTokens: 700}
	cs := scheduling.NewCycleState()
	res, err := b.Scheduler.Schedule(context.Background(), cs, req, eps)
	if err != nil {
		t.Fatal(err)
	}
	for _, hook := range b.PreRequest {
		hook.PreRequest(context.Background(), cs, req, res)
	}
	if got := res.Primary().Targets[0].Name(); got != "decode" {
		t.Fatalf("decode pick %s", got)
	}
	if got := res.Headers[eppwire.HeaderPrefiller]; got != "prefill-near:8000" {
		t.Fatalf("prefiller %q, want the decode host's prefill-near:8000", got)
	}
}
