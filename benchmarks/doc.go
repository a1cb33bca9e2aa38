// Package benchmarks is `kvgate bench`: it replays a workload (a Mooncake
// trace, llm-d's shared-prefix shape or a multi-turn chat) against a
// simulated cluster of model servers under several routing policies and
// writes results.json, a markdown table and PNG plots.
//
// Every policy is an EndpointPickerConfig run through the production
// picker (see package cluster); the built-in ones are random, round-robin,
// load, approx (GIE's default profile), precise (KV events) and oracle, a
// reference that reads the servers' true state. RESULTS.md beside this file
// records measured runs.
//
// Smooth Poisson arrivals hide herding on stale load metrics, so arrivals
// can be made bursty: --arrival-quantum floors them to a multiple of a
// duration, --burst sends a generated workload's requests N at a time. The
// fleet may mix hardware of one model (--presets name:count,...), reported
// per preset as well. --slo-ttft and --slo-tpot send latency objectives with
// a --slo-fraction of the requests and report their attainment; latency
// predictions the picker makes are scored (MAPE, predicted vs actual per
// preset, a scatter plot) when present.
//
// `kvgate bench pd` (pd.go) runs P/D disaggregation: collocated against
// xPyD fleets of equal GPU count, with a network model between the servers,
// and the deciders (always-disagg, prefix-based at several thresholds,
// kvgate's transfer-cost) on long, short and mixed prompts.
package benchmarks
