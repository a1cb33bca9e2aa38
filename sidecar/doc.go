// Package sidecar is `kvgate sidecar`: llm-d's P/D routing sidecar, the
// proxy in front of a decode pod's model server that carries out the
// picker's disaggregation decision. Flags, defaults, paths and wire
// rewriting are llm-d's pd-sidecar's (REFERENCE-LLMD §1.4-1.7), so a
// deployment's sidecar arguments work unchanged; what kvgate does not
// implement (the sglang and mooncake connectors, data parallelism, chunked
// decode, the --configuration YAML) is refused by name, never ignored.
//
// Requests: GET /health answers 200. POST /v1/chat/completions,
// /v1/completions, /v1/messages, /v1/responses and /inference/v1/generate
// are intercepted; every other request is proxied to the model server
// (127.0.0.1:--model-server-port) untouched, /metrics included. An
// intercepted request that the picker gave no prefiller, encoder or KV
// source is proxied the same way.
//
// Headers: x-prefiller-host-port (ip:port, or a comma list with
// --enable-prefiller-sampling), x-encoder-hosts-ports and
// x-kv-cache-source-host-port, each also under its x-llm-d-… name (the
// older name's value is trusted first, as in llm-d). Every spelling is
// removed before any leg is sent. Both legs carry a fresh x-request-id.
//
// nixlv2 (default): the prefill leg is the client's body with
// kv_transfer_params {do_remote_decode: true, do_remote_prefill: false,
// remote_engine_id/remote_block_ids/remote_host/remote_port: null},
// stream false, stream_options removed, the API's output caps set to 1
// (chat: max_tokens and max_completion_tokens; completions and messages:
// max_tokens; responses: max_output_tokens and store false; generate:
// sampling_params.max_tokens), min_tokens removed. It is retried on 502,
// 503 and 504 (--prefill-max-retries, --prefill-retry-backoff); any other
// failure is returned to the client as the prefiller sent it, with no
// local fallback. The decode leg is the client's body as sent, with
// kv_transfer_params replaced by exactly what the prefiller returned (null
// when it returned none), and its answer shows the prefiller's
// usage.prompt_tokens_details.cached_tokens — in a JSON body (creating
// prompt_tokens_details when absent) or in the SSE usage chunk, complete
// data: lines rewritten, data: [DONE] passed — with every other byte as
// the model server sent it. offloading sends both legs at once
// (remote_decoder / remote_prefiller {kv_request_id, remote_host,
// remote_port: --p2p-connector-port}); shared-storage tries the decoder
// first when the request has cache_hit_threshold, prefills on
// finish_reason "cache_threshold", and decodes with cache_hit_threshold 0.
// With a KV source and --enable-p2p-pull (or offloading) a pull
// {remote_kv_source: {kv_request_id, remote_host, remote_port}} is injected
// into the prefill leg, or replaces a decode-only request's
// kv_transfer_params; none when the source is the prefiller or this pod
// (POD_IP).
//
// E/P/D (--ec-connector): a chat request naming encoders fans out one
// request per image_url / audio_url / video_url / input_audio part (URLs
// de-duplicated), in parallel, round-robin over the encoders, each a copy
// of the request with that part as its only message, capped to one token,
// x-request-id <id>-enc-<n>. The first failure cancels the rest and is
// the client's answer. With ec-nixl the encoders' ec_transfer_params are
// merged into one object carried by the prefill leg (or the decode leg
// without a prefiller).
//
// SSRF protection (--enable-ssrf-protection, on by default in kvgate,
// off in llm-d): the targets the headers name are checked against the
// InferencePool's members as the picker learns them — the same discovery
// (package extproc/endpoints with its Kubernetes source for
// --inference-pool, or the static --endpoints file) — at their exact
// ip:port. A prefill target that is not a member is refused with 403 (503
// until the membership is first known); encoders that are not are dropped;
// a KV source that is not is ignored. Refusals count in
// kvgate_sidecar_ssrf_denied_total{stage}.
//
// The sidecar's own errors are llm-d's, vLLM's flat body of before 0.10.1:
// {"object":"error","message","type","param":null,"code"}: 400 BadRequestError for a body that is not a JSON object, 403
// Forbidden, 413, 502 BadGateway when a prefiller cannot be reached, 503
// ServiceUnavailable "The decode node is not ready..." when the local model
// server cannot, and 503 when the P/D bodies held at once (each reserved
// from --body-budget-bytes while its legs run) leave no room for another. Any request to an upstream — a leg, or a relayed request
// whose body streams from the client — that fails on a reused keep-alive
// connection before any answer is sent once more, on a new connection,
// when the upstream cannot have run it: the failure came before the
// request was written whole, or the request carries an Idempotency-Key or
// X-Idempotency-Key header (net/http's rule). One written whole and then
// met by a closed connection keeps its failure (the 503 or 502 below):
// the upstream may have read it and started the completion. A relayed
// body is kept as it is read, up to --max-request-body-bytes and within
// --replay-buffer-bytes, what all relayed bodies may keep at once, until
// it is written whole (with a key, until the answer's first byte); one
// larger, or one that finds the buffer spent, is relayed but not
// replayed. An answer never looks
// complete when it is not: once the model server's header went to the
// client, an answer that breaks off aborts the client's connection (no
// terminating chunk, a short Content-Length body, or an HTTP/2 reset); a
// JSON answer held for the cached_tokens rewrite that breaks off is a 502
// BadGateway. Requests passed through untouched are relayed full duplex,
// so a model server that answers while the client's body is still being
// forwarded (a stream's header goes out at once) is not cut off.
//
// Metrics (--metrics-port; the proxy port's /metrics is the model
// server's): llm_d_disagg_sidecar_requests_total{api_type},
// _disagg_requests_total{connector}, _encode/_prefill/_decode
// _duration_seconds{connector} and _request_errors_total{connector,stage},
// as llm-d's sidecar names them; kvgate adds
// kvgate_sidecar_ssrf_denied_total{stage},
// kvgate_sidecar_pd_requests_total{prefiller},
// kvgate_sidecar_replay_buffer_bytes and
// kvgate_sidecar_replay_buffer_full_total.
package sidecar
