// Package vllmgrpcparser is llm-d's and GIE's vllmgrpc-parser: the request
// parser for vLLM's gRPC server (service vllm.grpc.engine.VllmEngine of
// vLLM's vllm_engine.proto, the schema llm-d's parser reads). It claims
// the Generate and Embed methods, unwraps the gRPC frame (one
// uncompressed message) and decodes the protobuf itself (wire format, no
// generated code):
//
//	GenerateRequest: tokenized (2: TokenizedInput, input_ids = 2) or
//	                 text (3), sampling_params (4: max_tokens = 8),
//	                 stream (5)
//	EmbedRequest:    tokenized (2)
//
// The prompt's token ids are what the prefix plugins hash and match, as
// for vllmhttp-parser's generate requests; a text prompt is hashed as
// text. The request names no model (the server serves one), so a model
// rewrite leaves the body as sent. Not read: mm_inputs (the multimodal
// placeholders and hashes; the prompt's placeholder tokens are matched as
// any other token) and the responses (usage is not taken from gRPC
// responses).
//
// Parameters: none.
package vllmgrpcparser
