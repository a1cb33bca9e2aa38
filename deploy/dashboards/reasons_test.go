package dashboards

import (
	"regexp"
	"strings"
	"testing"
)

// A reason explains why an expression returns nothing on a kvgate fleet: a
// feature kvgate does not build (yet), or a component that is not part of
// it. It never covers a metric kvgate should serve under another name.
type reason struct {
	text string
	// metric matches the names of absent metrics this reason accounts for.
	metric *regexp.Regexp
	// selector, when set, accounts for an expression whose metrics all
	// exist but whose label selector picks what the fleet does not have.
	selector *regexp.Regexp
	// noPD marks a reason that holds only for a fleet without a P/D pool.
	noPD bool
}

var reasons = []reason{
	{text: "no P/D pool in this fleet (prefill/decode pods, NIXL transfers)", noPD: true,
		metric: regexp.MustCompile(`^vllm:nixl_`), selector: regexp.MustCompile(`(pod|endpoint_name)=~"\.\*(prefill|decode)\.\*"`)},
	{text: "Pub/Sub transport only: llm-d-async's redis-sortedset transport, which kvgate async implements, does not register message_latency_time_millis",
		metric: regexp.MustCompile(`^llm_d_async_async_message_latency_time_millis`)},
	{text: "kube-state-metrics, not part of a kvgate fleet", metric: regexp.MustCompile(`^kube_`)},
	// vLLM defines these counters as vllm:num_preemptions and
	// vllm:nixl_num_failed_transfers; its Prometheus client exports them
	// with the counter suffix.
	{text: "upstream dashboard bug: vLLM exports this counter with _total (vllm:num_preemptions_total, vllm:nixl_num_failed_transfers_total); the panel is empty against real vLLM too",
		metric: regexp.MustCompile(`^vllm:(num_preemptions|nixl_num_failed_transfers)$`)},
}

// explain returns why an expression that returned nothing may do so on a
// fleet without a P/D pool, or "" when nothing accepted explains it.
// missing are its metric names Prometheus does not hold.
func explain(expr string, missing []string) string { return explainFor(expr, missing, false) }

// explainFor is explain for a fleet that runs a P/D pool when withPD, where
// the P/D reason no longer holds.
func explainFor(expr string, missing []string, withPD bool) string {
	var why []string
	add := func(s string) {
		for _, w := range why {
			if w == s {
				return
			}
		}
		why = append(why, s)
	}
	applies := func(r reason) bool { return !withPD || !r.noPD }
	if len(missing) == 0 {
		for _, r := range reasons {
			if applies(r) && r.selector != nil && r.selector.MatchString(expr) {
				add(r.text)
			}
		}
		return strings.Join(why, "; ")
	}
	for _, name := range missing {
		found := false
		for _, r := range reasons {
			if applies(r) && r.metric != nil && r.metric.MatchString(name) {
				add(r.text)
				found = true
				break
			}
		}
		if !found {
			return ""
		}
	}
	return strings.Join(why, "; ")
}

// The P/D reason holds only where no P/D pool runs; the others hold
// everywhere, and an absent metric no reason names is never explained.
func TestExplain(t *testing.T) {
	const decodeTTFT = `sum(rate(vllm:time_to_first_token_seconds_sum{pod=~".*decode.*"}[5m]))`
	for _, tc := range []struct {
		expr    string
		missing []string
		withPD  bool
		want    string // a substring; "" for none
	}{
		{decodeTTFT, nil, false, "no P/D pool"},
		{decodeTTFT, nil, true, ""},
		{"sum(vllm:nixl_xfer_time_seconds_count)", []string{"vllm:nixl_xfer_time_seconds_count"}, false, "no P/D pool"},
		{"sum(vllm:nixl_xfer_time_seconds_count)", []string{"vllm:nixl_xfer_time_seconds_count"}, true, ""},
		{"sum(vllm:nixl_num_failed_transfers)", []string{"vllm:nixl_num_failed_transfers"}, true, "upstream dashboard bug"},
		{"max(kube_deployment_status_replicas)", []string{"kube_deployment_status_replicas"}, true, "kube-state-metrics"},
		{"sum(llm_d_epp_request_total)", []string{"llm_d_epp_request_total"}, false, ""},
		{"sum(kube_x) + sum(llm_d_epp_request_total)", []string{"kube_x", "llm_d_epp_request_total"}, true, ""},
	} {
		got := explainFor(tc.expr, tc.missing, tc.withPD)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("explainFor(%s, %v, withPD %v) = %q, want %q", tc.expr, tc.missing, tc.withPD, got, tc.want)
		}
	}
}
