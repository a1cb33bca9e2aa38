package metrics

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// gathered returns the families reg holds by name.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func labelNames(m *dto.Metric) string {
	var n []string
	for _, l := range m.GetLabel() {
		n = append(n, l.GetName())
	}
	sort.Strings(n)
	return strings.Join(n, ",")
}

// One request's life fills llm-d's catalog and its GIE twins with
// upstream's names, types, labels and buckets (llm-d-router
// pkg/epp/metrics: metrics.go, llm_d_router_metrics.go).
func TestCatalogMatchesUpstream(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	l := Labels{Model: "m", Target: "t", FairnessID: "tenant", Priority: 2}
	m.RequestReceived(l, 1500)
	m.RequestProcessing(300 * time.Microsecond)
	m.SchedulerDuration(50 * time.Microsecond)
	m.SchedulerAttempt(AttemptSuccess, "t", "pod-a", "ns", "8000")
	m.PluginDuration("Scorer", scheduling.TypedName{Type: "queue-scorer", Name: "q"}, 10*time.Microsecond)
	m.PrefixPredicted(scheduling.TypedName{Type: "prefix-cache-scorer", Name: "p"}, 50, 100)
	m.Running(l, 1)
	t0 := time.Unix(1000, 0)
	m.ITL(l, 20*time.Millisecond)
	m.ResponseComplete(l, Response{Received: t0, FirstChunk: t0.Add(100 * time.Millisecond), Done: t0.Add(1100 * time.Millisecond),
		Streaming: true, Bytes: 4000, Usage: openai.Usage{PromptTokens: 300, CompletionTokens: 11, CachedTokens: 128}, UsageFound: true,
		Processing: 2 * time.Millisecond})
	m.Running(l, -1)
	m.RequestError(l, "ModelServerError")
	m.DisaggDecision(scheduling.TypedName{Type: "disagg-profile-handler", Name: "h"}, "", "prefill-decode")
	m.PDDecision(scheduling.TypedName{Type: "pd-profile-handler", Name: "h"}, "m", "decode-only")

	const req = "fairness_id,model_name,priority,target_model_name"
	const gie = "model_name,target_model_name"
	for _, tc := range []struct {
		name, labels string
		typ          dto.MetricType
		buckets      []float64 // nil: not checked
		value        float64   // counter/gauge value, or histogram sample sum
	}{
		{"llm_d_epp_request_total", req, dto.MetricType_COUNTER, nil, 1},
		{"inference_objective_request_total", "model_name,priority,target_model_name", dto.MetricType_COUNTER, nil, 1},
		{"llm_d_epp_request_error_total", "error_code," + req, dto.MetricType_COUNTER, nil, 1},
		{"inference_objective_request_error_total", "error_code," + gie, dto.MetricType_COUNTER, nil, 1},
		{"llm_d_epp_request_duration_seconds", req, dto.MetricType_HISTOGRAM, generalLatencyBuckets, 1.1},
		{"inference_objective_request_duration_seconds", gie, dto.MetricType_HISTOGRAM, generalLatencyBuckets, 1.1},
		{"llm_d_epp_request_size_bytes", req, dto.MetricType_HISTOGRAM, requestSizeBuckets, 1500},
		{"inference_objective_request_sizes", gie, dto.MetricType_HISTOGRAM, requestSizeBuckets, 1500},
		{"llm_d_epp_response_size_bytes", req, dto.MetricType_HISTOGRAM, responseSizeBuckets, 4000},
		{"inference_objective_response_sizes", gie, dto.MetricType_HISTOGRAM, responseSizeBuckets, 4000},
		{"llm_d_epp_request_input_tokens", req, dto.MetricType_HISTOGRAM, inputTokenBuckets, 300},
		{"inference_objective_input_tokens", gie, dto.MetricType_HISTOGRAM, inputTokenBuckets, 300},
		{"llm_d_epp_request_output_tokens", req, dto.MetricType_HISTOGRAM, outputTokenBuckets, 11},
		{"inference_objective_output_tokens", gie, dto.MetricType_HISTOGRAM, outputTokenBuckets, 11},
		{"llm_d_epp_request_cached_tokens", req, dto.MetricType_HISTOGRAM, inputTokenBuckets, 128},
		{"inference_objective_prompt_cached_tokens", gie, dto.MetricType_HISTOGRAM, inputTokenBuckets, 128},
		{"llm_d_epp_request_running", req, dto.MetricType_GAUGE, nil, 0},
		{"inference_objective_running_requests", "model_name", dto.MetricType_GAUGE, nil, 0},
		{"llm_d_epp_request_ntpot_seconds", req, dto.MetricType_HISTOGRAM, ntpotBuckets, 0.1},
		{"inference_objective_normalized_time_per_output_token_seconds", gie, dto.MetricType_HISTOGRAM, ntpotBuckets, 0.1},
		{"llm_d_epp_request_ttft_seconds", "fairness_id,model_name,priority,streaming,target_model_name", dto.MetricType_HISTOGRAM, ttftBuckets, 0.1},
		{"llm_d_epp_request_streaming_tpot_seconds", req, dto.MetricType_HISTOGRAM, tpotBuckets, 0.1},
		{"llm_d_epp_request_streaming_itl_seconds", req, dto.MetricType_HISTOGRAM, itlBuckets, 0.02},
		{"llm_d_epp_request_processing_duration_seconds", "", dto.MetricType_HISTOGRAM, reqProcBuckets, 0.0003},
		{"llm_d_epp_response_processing_duration_seconds", "", dto.MetricType_HISTOGRAM, respProcBuckets, 0.002},
		{"llm_d_epp_scheduler_e2e_duration_seconds", "", dto.MetricType_HISTOGRAM, schedulerBuckets, 0.00005},
		{"inference_extension_scheduler_e2e_duration_seconds", "", dto.MetricType_HISTOGRAM, schedulerBuckets, 0.00005},
		{"llm_d_epp_scheduler_attempts_total", "endpoint_name,namespace,port,status,target_model_name", dto.MetricType_COUNTER, nil, 1},
		{"inference_extension_scheduler_attempts_total", "namespace,pod_name,port,status,target_model_name", dto.MetricType_COUNTER, nil, 1},
		{"llm_d_epp_plugin_duration_seconds", "extension_point,plugin_name,plugin_type", dto.MetricType_HISTOGRAM, schedulerBuckets, 0.00001},
		{"inference_extension_plugin_duration_seconds", "extension_point,plugin_name,plugin_type", dto.MetricType_HISTOGRAM, schedulerBuckets, 0.00001},
		{"llm_d_epp_prefix_indexer_hit_ratio", "plugin_name,plugin_type", dto.MetricType_HISTOGRAM, ratioBuckets, 0.5},
		{"inference_extension_prefix_indexer_hit_ratio", "", dto.MetricType_HISTOGRAM, ratioBuckets, 0.5},
		{"llm_d_epp_info", "build_ref,commit", dto.MetricType_GAUGE, nil, 1},
		{"inference_extension_info", "build_ref,commit", dto.MetricType_GAUGE, nil, 1},
		// llm-d-router disagg/metrics.go
		{"llm_d_epp_disagg_decision_total", "decision_type,model_name,plugin_name,plugin_type", dto.MetricType_COUNTER, nil, 1},
		{"llm_d_inference_scheduler_disagg_decision_total", "decision_type,model_name", dto.MetricType_COUNTER, nil, 1},
		{"llm_d_epp_pd_decision_total", "decision_type,model_name,plugin_name,plugin_type", dto.MetricType_COUNTER, nil, 1},
		{"llm_d_inference_scheduler_pd_decision_total", "decision_type,model_name", dto.MetricType_COUNTER, nil, 1},
	} {
		mf := gathered(t, reg)[tc.name]
		if mf == nil {
			t.Errorf("%s: not exported", tc.name)
			continue
		}
		if mf.GetType() != tc.typ || len(mf.GetMetric()) != 1 {
			t.Errorf("%s: type %v with %d series, want %v with 1", tc.name, mf.GetType(), len(mf.GetMetric()), tc.typ)
			continue
		}
		mt := mf.GetMetric()[0]
		if got := labelNames(mt); got != tc.labels {
			t.Errorf("%s: labels %q, want %q", tc.name, got, tc.labels)
		}
		var v float64
		switch tc.typ {
		case dto.MetricType_COUNTER:
			v = mt.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			v = mt.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			h := mt.GetHistogram()
			v = h.GetSampleSum()
			var got []float64
			for _, b := range h.GetBucket() {
				got = append(got, b.GetUpperBound())
			}
			if tc.buckets != nil && !equalFloats(got, tc.buckets) {
				t.Errorf("%s: buckets %v, want %v", tc.name, got, tc.buckets)
			}
		}
		if d := v - tc.value; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: value %v, want %v", tc.name, v, tc.value)
		}
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Fairness ids come from a client header: bounded like model names.
func TestFairnessLabelsBounded(t *testing.T) {
	m := New(prometheus.NewRegistry())
	for i := range MaxFairnessLabels + 10 {
		m.RequestReceived(Labels{Model: "m", Target: "m", FairnessID: "f" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}, -1)
	}
	if got := testutilCount(t, m.requests); got != MaxFairnessLabels+1 {
		t.Fatalf("%d series, want %d", got, MaxFairnessLabels+1)
	}
}

func testutilCount(t *testing.T, c prometheus.Collector) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 4096)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// A client-chosen value too long for a label, or not UTF-8, goes to the
// OtherModel series rather than into the registry.
func TestUnfitLabelValues(t *testing.T) {
	m := New(prometheus.NewRegistry())
	long := strings.Repeat("m", MaxLabelValueBytes+1)
	m.RequestReceived(Labels{Model: long, Target: "\xff", FairnessID: long}, -1)
	m.RequestReceived(Labels{Model: "ok", Target: "ok", FairnessID: "f"}, -1)
	if got := testutilCount(t, m.requests); got != 2 {
		t.Fatalf("%d series, want 2", got)
	}
	if v := testutil.ToFloat64(m.requests.WithLabelValues(OtherModel, OtherModel, OtherModel, "0")); v != 1 {
		t.Fatalf("other series %v, want 1", v)
	}
}
