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
	// selector, when set, accounts for an expression whose metrics all
	// exist but whose label selector picks what the fleet does not have.
	selector *regexp.Regexp
}

var reasons = []reason{
	{text: "P/D disaggregation not built yet: no prefill/decode pods (disagg profile handler, its own issue)",
		metric: regexp.MustCompile(`^vllm:nixl_`), selector: regexp.MustCompile(`(pod|endpoint_name)=~"\.\*(prefill|decode)\.\*"`)},
	{text: "GIE's Body-Based Router is a separate component kvgate does not build (the picker and the wasm filter read the model from the body)", metric: regexp.MustCompile(`^bbr_`)},
	{text: "the async processor (`kvgate async`, which exports llm_d_async_*; batch/async checks the dashboard's series) does not run in this test's fleet", metric: regexp.MustCompile(`^llm_d_async_`)},
	{text: "kube-state-metrics, not part of a kvgate fleet", metric: regexp.MustCompile(`^kube_`)},
	{text: "upstream dashboard bug: vLLM exports this counter as vllm:num_preemptions_total (the panel is empty against real vLLM too)", metric: regexp.MustCompile(`^vllm:num_preemptions$`)},
}

// explain returns why an expression that returned nothing may do so, or ""
// when nothing accepted explains it. missing are its metric names
// Prometheus does not hold.
func explain(expr string, missing []string) string {
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
		for _, r := range reasons {
			if r.selector != nil && r.selector.MatchString(expr) {
				add(r.text)
			}
		}
		return strings.Join(why, "; ")
	}
	for _, name := range missing {
		found := false
		for _, r := range reasons {
			if r.metric != nil && r.metric.MatchString(name) {
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
