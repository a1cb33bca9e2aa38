// Package demo is `kvgate up` (what `make run` runs): it starts a local
// fleet — simulated vLLM servers, the Endpoint Picker fed by their KV
// events, and the gateway with the wasm filter — as supervised child
// processes of the kvgate binary itself, replays a workload built from the
// Mooncake trace through the gateway once per routing policy, each on a
// fresh fleet (empty caches), and compares the runs.
//
// The fleet is sized so that routing decides the outcome on a laptop:
//   - Prompts are scaled down (see package workload), and the simulators
//     run at --time-scale 0.03, about 33× slower than the H100 timing
//     model, so that a scaled prompt costs the engine wall time of the
//     order a full-size one would.
//   - Each server's KV cache is 600 blocks of 16 tokens. The workload's
//     distinct prefixes (about 20k tokens) fit in the fleet's combined
//     cache but not in any one server's: the regime of a production fleet
//     serving more prefixes than one GPU holds. Round-robin makes every
//     server cache everything and thrash; a cache-aware picker partitions
//     the prefixes.
//
// Outputs, in --out: the comparison table (also on stdout), results.json
// (options, per-policy summaries, every request's measurements, each
// server's load samples), report.html (self-contained, inline SVG: TTFT
// CDF per policy, per-server load over time per policy) and
// logs/<policy>/<component>.log.
//
// Supervision (package proc): children share our process group, so a
// terminal's Ctrl-C reaches all of them, and carry a parent-death signal,
// so none outlives a crashed parent; stopping sends SIGTERM and, after
// StopGrace, SIGKILL. A component that dies ends the run with its last log
// lines. Ports are chosen by the OS.
//
// `kvgate up --pd xPyD` (pd.go, pd_run.go) instead runs the workload
// through a collocated fleet of x+y simulators and a P/D fleet — node
// agents, prefill and decode simulators, a routing sidecar (package
// sidecar) before each decode simulator, the picker with
// disagg-profile-handler — and reports TTFT/ITL, the P/D pairs and the KV
// transfers, in the terminal and in report.html (the same renderer as the
// policy comparison's, with the ITL distribution, the P/D tables and a
// chart of the transfer sizes); --epd adds an encode simulator and sends
// chats with images.
//
// Subpackages: proc supervises the children, workload builds and replays
// the requests, report summarises and renders.
package demo
