// Package gateway is kvgate's local stand-in for Envoy: an HTTP/1.1 and
// h2c reverse proxy that runs the real proxy-wasm filter (on wazero, see
// wasmhost) and then an ext_proc client with Envoy's semantics against the
// picker, and forwards each request to the endpoint the picker chose.
//
// Per request, in order:
//
//  0. Limits: more header values or bytes than Config.MaxRequestHeaders /
//     MaxRequestHeaderBytes is answered 431, a path in Config.BlockedPaths
//     (model servers' admin endpoints by default) 403. Body bytes held in
//     memory count against Config.BodyBudget (503 when it is spent), and a
//     body that stalls for Config.BodyIdleTimeout is answered 408.
//     With Config.BodyBasedRouting (--body-based-routing), GIE's
//     Body-Based Router step runs next: an OpenAI request's body is
//     buffered and its model set as X-Gateway-Model-Name, counted in BBR's
//     bbr_* metrics (served on --metrics-addr; bbr.go).
//  1. x-gateway-destination-endpoint sent by the client is dropped: only
//     the picker chooses upstreams. x-kvgate-* headers are dropped too when
//     no filter runs (the filter strips them itself otherwise), and the
//     model rewrite headers unless Config.TrustClientRewrite.
//  2. The filter sees the request headers and, while it pauses, the
//     buffered body (bounded by Config.MaxRequestBuffer, 413 above it, as
//     Envoy's buffer limit).
//  3. ext_proc: request headers (values as raw_value) and, in
//     FULL_DUPLEX_STREAMED mode, the body in chunks; the picker's header
//     mutations, dynamic metadata, immediate responses and streamed body
//     are applied. In NONE mode the body bypasses the picker (the fast
//     path, when the filter has tagged the request).
//  4. The upstream is the picker's x-gateway-destination-endpoint (header,
//     else envoy.lb dynamic metadata): a comma list tried in order while
//     connecting fails. The exchange is full duplex: the answer may start
//     while the client's body is still on its way upstream.
//  5. Response headers (with envoy.lb x-gateway-destination-endpoint-served
//     in the metadata context), the body streamed through the picker chunk
//     by chunk, and trailers; every chunk is flushed to the client at once,
//     so SSE events are never held back.
//
// When the picker cannot be reached or fails, FailureModeAllow decides as
// Envoy's failure_mode_allow does (ext_proc.cc: Filter::onGrpcError,
// onMessageTimeout, failureModeAllow):
//
//   - Without it every failure fails the request: 500 (504 on a message
//     timeout, also when opening the stream takes longer) before the
//     response began, a cut response (connection closed, HTTP/2 stream
//     reset) after. A picker stream that fails while the upstream works on
//     the request (the picker revoked it) fails it at once, the upstream
//     request cancelled.
//   - With it, and whatever it says after the picker's clean close of its
//     stream (onGrpcClose), the request goes on without the picker: to the
//     fallback endpoints (each request starting at the next one in turn)
//     while the picker has not chosen, else to its choice, the response
//     passing unprocessed. Not once some of a FULL_DUPLEX_STREAMED body
//     has reached the picker: Envoy keeps no copy of such a body, so from
//     its first chunk on, in either direction, a failure fails the request
//     as without (a request body none of which reached the picker still
//     goes on whole). A response streaming through the picker is cut
//     either way.
//
// The picker connection reconnects with a back-off of at most
// Config.PickerReconnectMax and is health-checked. An upstream exchange
// that makes no progress for Config.UpstreamIdleTimeout is cut.
// mode_override is ignored, as Envoy ignores it without
// allow_mode_override (which the stand-in does not offer) and always with
// a FULL_DUPLEX_STREAMED mode configured.
//
// Where it differs from Envoy: the message timeout (Config.ExtProcTimeout)
// also bounds each wait in FULL_DUPLEX_STREAMED mode, where Envoy has none;
// request trailers are not sent to the picker (response trailers are, in
// place of the body's end-of-stream chunk, as Envoy sends them); the
// response body goes to the picker only once it answered the response
// headers (Envoy streams it as it arrives), so a failure while that answer
// is pending finds none of it at the picker and may still fail open; a
// clean close once part of a FULL_DUPLEX_STREAMED body is with the picker
// fails the request as an error does, where Envoy goes on without the
// part the picker kept.
//
// One access-log record per request goes to slog.
package gateway
