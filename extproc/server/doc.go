// Package server is the picker's Envoy ext_proc handler: it speaks
// envoy.service.ext_proc.v3.ExternalProcessor/Process the way the Gateway API
// Inference Extension's Endpoint Picker does, and knows nothing about
// scheduling. Each HTTP request is one gRPC stream; the handler turns it into
// a Request, asks a Director where it goes, answers Envoy with the decision
// (the x-gateway-destination-endpoint header and envoy.lb dynamic metadata),
// then streams the response back unchanged while reporting it to the
// Director.
//
// Supported processing modes: request headers SEND; request body
// FULL_DUPLEX_STREAMED (the compatible path, and the assumption when Envoy
// sends no protocol_config) or NONE (kvgate's fast path, where the wasm
// filter has already parsed the body into headers); response body
// FULL_DUPLEX_STREAMED, STREAMED, BUFFERED or NONE; trailers SEND or SKIP.
// Other request body modes are refused with codes.Unimplemented, because the
// decision has to be made before Envoy releases the headers upstream.
//
// Bodies are parsed by Options.Parser (the configuration's request parsers,
// extproc/parsers), or, without one, as the OpenAI API their :path names
// (openai.APIFromPath). A body the parser routes without interpretation, or
// whose :path is not an OpenAI API, is not refused: it is buffered and
// handed to the Director with Parsed nil, so that the Director's policy,
// not the protocol layer, decides what happens to it.
//
// Budgets: a header message over Options.MaxHeaders or MaxHeaderBytes is
// answered 431 (repeats are joined in linear time below the limits); request
// bodies of all streams together draw on Options.BodyBudget (503 when it is
// spent) and are dropped once sent back; a stream silent for
// RequestIdleTimeout while its request arrives, or ResponseIdleTimeout once
// routed, is ended (DeadlineExceeded) and its exchange released. A request
// its Exchange revokes (Revocable) has its stream ended (Aborted) at once,
// without waiting for Envoy's next message.
//
// Concurrency: gRPC runs each stream on its own goroutine, and everything a
// stream owns (its Request, body buffer and usage scanner) is touched only by
// that goroutine. The Director is called from many streams at once and must
// be safe for concurrent use; a Request passed to it is not shared between
// streams.
package server
