package dashboards

import (
	"regexp"
	"strings"
)

// A reason explains why an expression returns nothing on a kvgate fleet: a
// feature kvgate does not build (yet), or a component that is not part of
// it. It never covers a metric kvgate should serve under another name.
type reason struct {
	text string
	// metric matches the names of absent metrics this reason accounts for.
	metric *regexp.Regexp
}

var reasons = []reason{
	{text: "Pub/Sub transport only: llm-d-async's redis-sortedset transport, which kvgate async implements, does not register message_latency_time_millis",
		metric: regexp.MustCompile(`^llm_d_async_async_message_latency_time_millis`)},
	{text: "kube-state-metrics, not part of a kvgate fleet", metric: regexp.MustCompile(`^kube_`)},
	// vLLM defines these counters as vllm:num_preemptions and
	// vllm:nixl_num_failed_transfers; its Prometheus client exports them
	// with the counter suffix.
	{text: "upstream dashboard bug: vLLM exports this counter with _total (vllm:num_preemptions_total, vllm:nixl_num_failed_transfers_total); the panel is empty against real vLLM too",
		metric: regexp.MustCompile(`^vllm:(num_preemptions|nixl_num_failed_transfers)$`)},
}

// explain returns why an expression that returned nothing may do so, or ""
// when nothing accepted explains it. missing are its metric names
// Prometheus does not hold: an expression whose metrics all exist but
// select nothing is never explained, since every part of an llm-d fleet
// runs in the test's.
func explain(_ string, missing []string) string {
	var why []string
	add := func(s string) {
		for _, w := range why {
			if w == s {
				return
			}
		}
		why = append(why, s)
	}
	if len(missing) == 0 {
		return ""
	}
	for _, name := range missing {
		found := false
		for _, r := range reasons {
			if r.metric.MatchString(name) {
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
