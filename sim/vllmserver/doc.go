// Package vllmserver is `kvgate sim`: a vLLM-compatible OpenAI HTTP server in
// front of the sim/engine model, for running the picker and the gateway
// against a fleet of fake GPUs on one machine.
//
// It speaks what the rest of the stack reads from a real vLLM pod:
// /v1/completions and /v1/chat/completions (JSON and SSE, with
// stream_options.include_usage and usage.prompt_tokens_details.cached_tokens),
// /v1/models, /health, /metrics with vLLM's metric names, KV-cache events on
// ZMQ in vLLM's wire format, and the kv_transfer_params of vLLM's
// NixlConnector for P/D disaggregation. Prompts are tokenized with the real
// tokenizer (chat through its chat template), so the block hashes it
// publishes are the ones vLLM would publish for the same prompt.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions, GET
// /v1/models, GET /health, GET /metrics, POST /reset_prefix_cache (as
// vLLM's dev endpoint; announces AllBlocksCleared) and POST
// /kvgate/release_kv (below). Errors use vLLM's body (≥ 0.10.1)
// {"error":{"message":...,"type":...,"param":null,"code":...}}: 400 for bad
// JSON, bad fields or an exceeded context, 404 for an unknown model, 429
// when the engine's waiting queue is full, 500 for injected failures and,
// as vLLM ≥ 0.11.1, for a failed KV load under --kv-load-failure-policy
// fail (type InternalServerError, "Internal server error" and the cause);
// a stream gets that one after its headers and first chunk, as an error
// event before [DONE]. A client that disconnects has its request aborted in
// the engine.
//
// Hosts a request names: kv_transfer_params name the hosts of a decode
// leg's release_kv call, of its pull through --agent (remote_host) and of a
// remote_kv_source or remote_prefiller pull. Every such dial goes through
// one check (peers.go): a loopback address, localhost or one of
// --kv-allowed-hosts (addresses, CIDR prefixes, names), nothing else, so
// that a client cannot have the server dial its network for it. A refused
// host is never dialled, is logged and counted
// (kvgate_sim_refused_dials_total{dial}), and is answered as the call's
// own failure: a release is left to the prefiller's held-block timeout
// (the request is served), a pull is a failed KV load under
// --kv-load-failure-policy. The HTTP calls have their own client: no proxy
// from the environment, a 5 s connect bound, no redirects.
//
// What a simulation cannot mean is left out: the model never emits EOS, so
// every request generates max_tokens (default --default-max-tokens; an
// explicit 0 reads as unset), and sampling parameters (temperature, stop,
// n, seed, logprobs) are accepted and ignored. Generated tokens are drawn
// by the engine from the model's vocabulary, seeded per request id; ids
// past the tokenizer's vocabulary (the model's padding rows) decode to no
// text. --echo answers with the prompt's tokens instead (chat: the last
// message), finishing with "stop" when the echo is shorter than max_tokens.
//
// # Time
//
// The engine runs on a clock --time-scale times faster than wall time.
// Every latency the server reports (the /metrics histograms) is in
// simulated seconds, measured on that clock from the moment the request is
// handed to the engine, so that TTFT and ITL mean the same thing at any
// scale; HTTP parsing and tokenization are not part of the model and are
// excluded. KV-event batch timestamps are wall-clock Unix seconds, as
// subscribers compare them with their own clock.
//
// # Hash seed
//
// --hash-seed (vLLM's PYTHONHASHSEED) defaults to kvhash.DefaultSeed
// ("42", llm-d's convention and the seed of the shared test vector). A
// picker that scores prefixes from KV events or computes block hashes
// itself must use the same value.
//
// # P/D
//
// A request with kv_transfer_params.do_remote_decode runs prefill only; its
// response carries the kv_transfer_params a decoder needs, with
// remote_host/remote_port naming this server's HTTP address. Its blocks stay
// held until the decoder releases them or --kv-held-timeout (simulated)
// passes. A request with do_remote_prefill models pulling that KV, counts
// it in cached_tokens and, once its first token is out (the pull has
// landed), releases the prefiller's blocks with
// POST http://<remote_host>:<remote_port>/kvgate/release_kv
// {"request_id": "<remote_request_id>"}, standing in for NIXL's completion
// notification. The endpoint may also be called by hand.
//
// # Real KV bytes (--agent)
//
// With --agent ADDR the server shares a region file (/dev/shm) with its
// node agent (kvgate-agent), which registers it with NIXL; each block's
// bytes (--kv-bytes-per-token × block size; the preset model's real size by
// default) are a deterministic function of its hash (agent/kvblock). A
// prefill leg stores its full blocks under a hold and answers
// remote_host:remote_port = the agent (vLLM's side channel) and
// remote_block_ids = region slots. A decode leg has its agent READ those
// blocks by NIXL before the engine sees the request, checks every byte,
// and counts the measured pull in TTFT; the READ's notification frees the
// prefiller's hold (no release_kv call). A failed or timed-out pull follows
// --kv-load-failure-policy: fail (500) or recompute. GPU-tier evictions are
// copied to the agent's CPU tier; a later request whose leading blocks the
// engine lost loads them back (counted as cached). kv_transfer_params
// remote_kv_source {remote_host, remote_port} (a peer agent) pulls the
// prompt's leading blocks from that peer's CPU tier (P2P). /metrics adds
// vLLM's NixlConnector series (vllm:nixl_xfer_time_seconds,
// vllm:nixl_post_time_seconds, vllm:nixl_bytes_transferred,
// vllm:nixl_num_descriptors, vllm:nixl_num_failed_transfers_total,
// vllm:nixl_num_kv_expired_reqs_total) and kvgate_sim_kv_* counters.
//
// # Other KV connectors (--kv-transfer-config)
//
// vLLM's --kv-transfer-config JSON selects the P/D connector the
// sidecar's --kv-connector pairs with. NixlConnector is the behaviour
// above. SharedStorageConnector (shared_storage_path, vLLM's default
// /tmp) writes every finished prompt's full blocks to the folder, one file
// per block hash written whole before it appears, and loads the leading
// blocks present there before a request runs, checking every byte.
// OffloadingConnector (TieringOffloadingSpec with one p2p secondary tier
// at host:port, bounded by cpu_bytes_to_use) keeps a prefill leg's blocks
// under its kv_transfer_params.remote_decoder.kv_request_id; a decode leg
// naming remote_prefiller {kv_request_id, remote_host, remote_port} fetches
// them from that tier over HTTP (GET /kvgate/p2p/{kv_request_id}, standing
// in for the tier's NIXL transfer; only from an allowed remote_host, as
// above), waiting up to --kv-transfer-timeout
// for a prefill sent at the same time to land, and checks them. Loaded
// blocks count as a remote prefill (cached_tokens); a failed load follows
// --kv-load-failure-policy. A request's cache_hit_threshold in [0, 1] is
// answered at once, generating nothing, with finish_reason
// "cache_threshold" when less of its prompt than that is cached, by the
// prefix cache or the connector. Other connectors and fields are refused
// by name; neither connector combines with --agent. Blocks are
// --kv-bytes-per-token × block size each (the model's real size by
// default: megabytes per block), and the shared folder is never pruned,
// as vLLM's debug connector leaves it.
package vllmserver
