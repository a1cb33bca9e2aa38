package coremetrics

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestEngineConfigs(t *testing.T) {
	x, err := schedtest.Build[*Extractor](New, `{"defaultEngine":"triton","engineConfigs":[
		{"name":"my-engine","queuedRequestsSpec":"custom_queue_size{status=waiting}","runningRequestsSpec":"custom_running","kvUsageSpec":"custom_kv"},
		{"name":"vllm","queuedRequestsSpec":"vllm:num_requests_waiting_v2","kvUsageSpec":"vllm:kv_cache_usage_perc","cacheInfoSpec":"vllm:cache_config_info"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	g := x.ScrapeEngines()
	ep := func(engine string) *endpoints.Endpoint {
		if engine == "" {
			return schedtest.Endpoint("e", endpoints.Metrics{})
		}
		return schedtest.Endpoint("e", endpoints.Metrics{}, scrape.EngineLabel, engine)
	}
	if s := g.For(ep("my-engine")); s == nil || s.Queue.String() != `custom_queue_size{status="waiting"}` || s.Running.Name != "custom_running" {
		t.Fatalf("my-engine schema = %+v", s)
	}
	// A configured vllm replaces the built-in one (and reads cache_config_info's vLLM labels).
	if s := g.For(ep("vllm")); s == nil || s.Queue.Name != "vllm:num_requests_waiting_v2" || s.CacheBlockSizeLabel != "block_size" {
		t.Fatalf("vllm schema = %+v", s)
	}
	// No label: the default engine, triton, built in.
	if s := g.For(ep("")); s == nil || s.Queue.Name != "nv_inference_pending_request_count" {
		t.Fatalf("default schema = %+v", s)
	}
	// SGLang stays on the native parser.
	if s := g.For(ep("sglang")); s != nil {
		t.Fatalf("sglang schema = %+v, want native", s)
	}
}

func TestParamErrors(t *testing.T) {
	for params, want := range map[string]string{
		`{"defaultEngine":"nope"}`:                       "defaultEngine",
		`{"engineConfigs":[{"queuedRequestsSpec":"q"}]}`: "name is required",
		`{"engineConfigs":[{"name":"a","queuedRequestsSpec":"q"},{"name":"a","queuedRequestsSpec":"q"}]}`: "twice",
		`{"engineConfigs":[{"name":"a"}]}`:                            "at least one",
		`{"engineConfigs":[{"name":"a","queuedRequestsSpec":"q{x"}]}`: "queuedRequestsSpec",
		`{"engineConfigs":[{"name":"a","queuedRequestsSpec":"q","customMetrics":[{"attributeKey":"k","metricSpec":"m"}]}]}`: "customMetrics",
		`{"engineLabel":"x"}`: "unknown field",
	} {
		if _, err := New("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
}

func TestAcceptsSource(t *testing.T) {
	x, err := schedtest.Build[*Extractor](New, ``)
	if err != nil {
		t.Fatal(err)
	}
	src, err := metricsdatasource.New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.AcceptsSource(src.(scheduling.DataSource)); err != nil {
		t.Fatal(err)
	}
	if err := x.AcceptsSource(otherSource{scheduling.NewNamed("dcgm-source", "")}); err == nil {
		t.Fatal("a non-metrics source accepted")
	}
}

type otherSource struct{ scheduling.Named }

func (otherSource) DataLayerSource() {}

// TestGIEName: GIE v1.4's model-server-protocol-metrics documents load
// with this extractor's parameters (its guide's example:
// SGLang as the default engine, the GIE engine label, a triton table).
func TestGIEName(t *testing.T) {
	for _, tc := range []struct {
		params, engine, wantQueue string
	}{
		{`{"defaultEngine":"sglang"}`, "", ""},
		{`{"engineLabelKey":"inference.networking.k8s.io/engine-type","defaultEngine":"vllm","engineConfigs":[
			{"name":"triton","queuedRequestsSpec":"nv_trt_llm_request_metrics{request_type=waiting}"}]}`, "triton", `nv_trt_llm_request_metrics{request_type="waiting"}`},
	} {
		x, err := schedtest.Build[*Extractor](New, tc.params)
		if err != nil {
			t.Fatalf("%s: %v", tc.params, err)
		}
		ep := schedtest.Endpoint("e", endpoints.Metrics{}, scrape.EngineLabelLegacy, tc.engine)
		s := x.ScrapeEngines().For(ep)
		switch {
		case tc.wantQueue == "" && s != nil:
			t.Errorf("%s: schema %+v, want SGLang's native parser", tc.params, s)
		case tc.wantQueue != "" && (s == nil || s.Queue.String() != tc.wantQueue):
			t.Errorf("%s: schema %+v, want queue %s", tc.params, s, tc.wantQueue)
		}
	}
}
