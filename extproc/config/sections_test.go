package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

const llmdHead = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"

func TestAPIVersions(t *testing.T) {
	for _, v := range APIVersions {
		if _, err := build(t, "apiVersion: "+v+"\nkind: EndpointPickerConfig\n"); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

// The data layer's metrics source and extractor reach the scraper's
// settings; wired explicitly, or listed without a dataLayer section as
// llm-d's chart does.
func TestDataLayerMetrics(t *testing.T) {
	const plugins = "plugins:\n- type: metrics-data-source\n  parameters: {scheme: https, path: /stats, interval: 200ms}\n" +
		"- name: engines\n  type: core-metrics-extractor\n  parameters: {defaultEngine: trtllm-serve}\n- type: queue-scorer\n"
	for name, yaml := range map[string]string{
		"wired":    llmdHead + plugins + "dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors:\n    - pluginRef: engines\n",
		"unwired":  llmdHead + plugins,
		"GIE data": llmdHead + plugins + "data:\n  sources:\n  - pluginRef: metrics-data-source\n    extractors:\n    - pluginRef: engines\n",
	} {
		t.Run(name, func(t *testing.T) {
			b, err := build(t, yaml)
			if err != nil {
				t.Fatal(err)
			}
			sc := b.Metrics.Scrape(scrape.Config{Interval: 50 * time.Millisecond})
			if sc.Target.Scheme != "https" || sc.Target.Path != "/stats" || sc.Interval != 200*time.Millisecond || sc.Engines == nil || sc.Engines.Default != "trtllm-serve" {
				t.Fatalf("scrape config %+v", sc)
			}
		})
	}
	// Without a metrics source the flags' settings stand.
	b, err := build(t, llmdHead+"plugins:\n- type: queue-scorer\n")
	if err != nil {
		t.Fatal(err)
	}
	if sc := b.Metrics.Scrape(scrape.Config{Interval: time.Second}); sc.Target != (scrape.Target{}) || sc.Engines != nil || sc.Interval != time.Second {
		t.Fatalf("default scrape config %+v", sc)
	}
}

// Every section, field, gate and plugin kvgate does not implement is an
// error naming it; the upstream names of missing features say which.
func TestSectionErrors(t *testing.T) {
	ms := "plugins:\n- type: metrics-data-source\n- type: core-metrics-extractor\n- type: openai-parser\n- type: queue-scorer\n"
	tests := []struct {
		name, yaml, want, feature string
	}{
		{"unknown gate", llmdHead + "featureGates: [dataLayer, magic]\n", `featureGates[1]: "magic"`, FeatureOther},
		{"discovery not configured", llmdHead + "dataLayer:\n  discovery: {pluginRef: file-discovery}\n", `dataLayer.discovery.pluginRef: "file-discovery" is not a configured plugin`, ""},
		{"discovery not a discovery", llmdHead + ms + "dataLayer:\n  discovery: {pluginRef: queue-scorer}\n", "is not an endpoint discovery", ""},
		{"discovery not wired", llmdHead + "plugins:\n- type: file-discovery\n  parameters: {path: /e.yaml}\n", "discovers endpoints but dataLayer.discovery does not name it", ""},
		{"peer discovery", llmdHead + "dataLayer:\n  peerDiscovery: {pluginRef: dns}\n", `dataLayer.peerDiscovery`, FeatureOther},
		{"cross replica", llmdHead + "dataLayer:\n  crossReplicaSyncerPluginRef: redis\n", `crossReplicaSyncerPluginRef`, FeatureOther},
		// GIE's earlier name of the section holds the same fields.
		{"peer discovery under data", llmdHead + "data:\n  peerDiscovery: {pluginRef: dns}\n", `data.peerDiscovery`, FeatureOther},
		{"cross replica under data", llmdHead + "data:\n  crossReplicaSyncInterval: 5s\n", `data.crossReplicaSyncInterval`, FeatureOther},
		{"unknown type", llmdHead + "plugins:\n- type: sglanghttp-parser\n", `unknown plugin type "sglanghttp-parser"`, ""},
		{"parser not configured", llmdHead + ms + "requestHandler:\n  parsers:\n  - pluginRef: my-parser\n", `requestHandler.parsers[0].pluginRef: "my-parser" is not a configured plugin nor a parser type`, ""},
		{"parser after fallback", llmdHead + ms + "requestHandler:\n  parsers:\n  - pluginRef: passthrough-parser\n  - pluginRef: openai-parser\n", "must be last", ""},
		{"parser not a parser", llmdHead + ms + "requestHandler:\n  parsers:\n  - pluginRef: queue-scorer\n", "is not a request parser", ""},
		{"GIE parser form", llmdHead + ms + "parser:\n  pluginRef: queue-scorer\n", "parser.pluginRef", ""},
		{"both parser forms", llmdHead + ms + "parser: {pluginRef: openai-parser}\nrequestHandler:\n  parsers: [{pluginRef: openai-parser}]\n", "give one", ""},
		{"both data sections", llmdHead + ms + "data: {}\ndataLayer: {}\n", "give one", ""},
		{"source not configured", llmdHead + ms + "dataLayer:\n  sources: [{pluginRef: dcgm-source}]\n", `dataLayer.sources[0].pluginRef: "dcgm-source" is not a configured plugin`, ""},
		{"source not a source", llmdHead + ms + "dataLayer:\n  sources: [{pluginRef: queue-scorer}]\n", "is not a data source", ""},
		{"extractor not an extractor", llmdHead + ms + "dataLayer:\n  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: openai-parser}]}]\n", "is not a data extractor", ""},
		{"two metrics sources", llmdHead + "plugins:\n- {name: a, type: metrics-data-source}\n- {name: b, type: metrics-data-source}\ndataLayer:\n  sources: [{pluginRef: a}, {pluginRef: b}]\n", "a second metrics source", ""},
		{"loose second source", llmdHead + "plugins:\n- {name: a, type: metrics-data-source}\n- {name: b, type: metrics-data-source}\n", "not wired", ""},
		{"no metrics without defaults", llmdHead + "dataLayer:\n  injectDefaults: false\n", "injectDefaults", ""},
		{"unknown dataLayer field", llmdHead + "dataLayer:\n  source: []\n", `unknown field "source"`, ""},
		{"models source without extractors", llmdHead + ms + "- type: models-data-source\ndataLayer:\n  sources: [{pluginRef: models-data-source}]\n", "has no extractors", ""},
		{"loose models source", llmdHead + ms + "- type: models-data-source\n", "not wired", ""},
		{"loose models extractor", llmdHead + ms + "- type: models-data-extractor\n", "not wired", ""},
		{"models extractor under the metrics source", llmdHead + ms + "- type: models-data-extractor\ndataLayer:\n  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: models-data-extractor}]}]\n", "reads a models-data-source", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(t, tc.yaml)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			var u *UnsupportedError
			if tc.feature != "" && (!errors.As(err, &u) || u.Feature != tc.feature) {
				t.Fatalf("error %v: want an UnsupportedError for %s", err, tc.feature)
			}
		})
	}
}

// A models source wired with its extractor is a poller the picker runs.
func TestDataLayerPollers(t *testing.T) {
	b, err := build(t, llmdHead+"plugins:\n- {type: models-data-source, name: src, parameters: {interval: 5s}}\n- {type: models-data-extractor, name: x}\n"+
		"dataLayer:\n  sources: [{pluginRef: src, extractors: [{pluginRef: x}]}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Pollers) != 1 || b.Metrics.Scrape(scrape.Config{}).Target != (scrape.Target{}) {
		t.Fatalf("pollers %v; the metrics target must stay the flags' (%+v)", b.Pollers, b.Metrics)
	}
}

// Known gates of features kvgate always has are accepted.
func TestFeatureGatesAlwaysOn(t *testing.T) {
	b, err := build(t, llmdHead+"featureGates: [dataLayer, prepareDataPlugins]\n")
	if err != nil {
		t.Fatal(err)
	}
	if !b.FeatureGates["dataLayer"] || !b.FeatureGates["prepareDataPlugins"] {
		t.Fatalf("gates %v", b.FeatureGates)
	}
}

// llm-d's producer/scorer split: the scorer and no-hit-lru-scorer read a
// producer listed after them (the order of plugins does not matter).
func TestProducerScorerWiring(t *testing.T) {
	yaml := llmdHead + `plugins:
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: gpu}
- type: no-hit-lru-scorer
  parameters: {prefixMatchInfoProducerName: gpu}
- name: gpu
  type: approx-prefix-cache-producer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: no-hit-lru-scorer
  - pluginRef: gpu
`
	b, err := build(t, yaml)
	if err != nil {
		t.Fatal(err)
	}
	got := shape(b.Scheduler.Profiles()["default"])
	if len(got.scorers) != 2 || got.scorers["prefix-cache-scorer"] != 3 || got.scorers["no-hit-lru-scorer"] != 1 {
		t.Fatalf("profile %+v: the producer must not be a scorer", got)
	}
	if len(b.PreRequest) != 2 {
		t.Fatalf("%d PreRequest hooks, want the producer's and no-hit-lru's", len(b.PreRequest))
	}
	if _, err := build(t, strings.Replace(yaml, "name: gpu", "name: cpu", 1)); err == nil || !strings.Contains(err.Error(), `"gpu" is not a configured plugin`) {
		t.Fatalf("dangling producer: %v", err)
	}
}

// llm-d's metricsLoggingInterval reaches the picker: the shortest asked.
func TestKVIndexLogInterval(t *testing.T) {
	const producer = "- type: precise-prefix-cache-producer\n  name: %s\n  parameters:\n    indexerConfig:\n      kvBlockIndexConfig: {enableMetrics: true, metricsLoggingInterval: %d}\n"
	c, err := Parse([]byte(llmdHead + "plugins:\n" + fmt.Sprintf(producer, "a", int64(time.Minute)) + fmt.Sprintf(producer, "b", int64(10*time.Second))))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(c, all.Registry(), &scheduling.Handle{Services: precise.WithKVIndex(nil, kvindex.New(kvindex.Config{}))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.KVIndexLogInterval != 10*time.Second {
		t.Fatalf("interval %v", b.KVIndexLogInterval)
	}
	if b, err = build(t, llmdHead); err != nil || b.KVIndexLogInterval != 0 {
		t.Fatalf("default: %v %v", b.KVIndexLogInterval, err)
	}
}

// The request handler: the parsers listed (a type name not configured as a
// plugin builds that parser, as in llm-d), GIE's single parser, or llm-d's
// defaults.
func TestRequestHandler(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"defaults", llmdHead, []string{"openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser"}},
		{"listed", llmdHead + "plugins:\n- {name: mine, type: openai-parser}\nrequestHandler:\n  parsers:\n  - pluginRef: vllmhttp-parser\n  - pluginRef: mine\n", []string{"vllmhttp-parser", "openai-parser"}},
		{"GIE parser", llmdHead + "plugins:\n- type: openai-parser\nparser: {pluginRef: openai-parser}\n", []string{"openai-parser"}},
		{"payload agnostic", llmdHead + "requestHandler:\n  parsers: [{pluginRef: passthrough-parser}]\n", []string{"passthrough-parser"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := build(t, tc.yaml)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range b.Parsers.Parsers() {
				got = append(got, p.TypedName().Type)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("parsers %v, want %v", got, tc.want)
			}
		})
	}
	b, err := build(t, llmdHead+"requestHandler:\n  parsers: [{pluginRef: openai-parser}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Parsers.Parse("/v1/messages", []byte(`{}`)); err == nil {
		t.Fatal("an explicit list without a fallback accepted an unclaimed path")
	}
}
