// Package tokenproducer is llm-d's token-producer: a data producer that
// leaves the request's prompt as tokens in prefixmatch.TokensKey, for the
// prefix matchers (the approximate ones hash these tokens in blocks, the
// precise one needs no tokenizer of its own), and sets the request's prompt
// length to their count, which the load, latency and P/D plugins read.
// The tokens last until the decision: the producer's PreRequest drops them,
// so that a streaming response does not keep them in memory.
// Two backends, as in llm-d:
//
//   - estimate (the default when no vllm block and no modelName is given):
//     no model, no service. The prompt's bytes, four to a pseudo token
//     (little-endian uint32): for chat, the tools' JSON then each
//     message's role and text; every image, video or audio part becomes a
//     run of placeholder tokens on a token boundary, each the low 32 bits
//     of the xxhash64 of the part's URL (or audio data), as many as the
//     model server's placeholders: width*height/factor for an image
//     (dimensions decoded from a base64 data URL, else defaultResolution;
//     640x360 and 1024 by default) or a static count; frames x tokens
//     per frame for a video, with the duration, source frame rate and
//     resolution taken from the x-llm-d-video-duration-seconds,
//     x-llm-d-video-fps and x-llm-d-video-resolution headers when sent.
//     Anthropic messages, completions, responses and embeddings are
//     packed alike; token-id prompts pass through. The pseudo tokens
//     serve locality hashing only: paired with the precise matcher they
//     match nothing a server reports, as llm-d warns.
//   - vllm: asks a vLLM render endpoint (`vllm serve` or the GPU-less
//     `vllm launch render`) for the tokens exactly as the model server's
//     tokenizer and chat template make them. POST
//     {url}/v1/completions/render takes the completions prompt, POST
//     {url}/v1/chat/completions/render the chat messages (with tools,
//     documents and the chat-template fields); "model" is modelName. A
//     failed or slow render leaves no tokens and the matchers fall back
//     to the prompt text, as llm-d's director logs and continues.
//
// The deprecated udsTokenizerConfig backend is refused.
//
// Parameters (llm-d's names):
//
//	modelName: string   model sent in render requests; selects vllm
//	vllm: object        url (default http://localhost:8000; "http" is its
//	                    older name), timeout (default 5s), mmTimeout for
//	                    requests with images, audio or video (default 30s)
//	estimate: object    image{mode dynamic|static, defaultResolution{width,
//	                    height}, dynamic{factor}, static{staticToken}},
//	                    video{defaultResolution, defaultDuration (10 s),
//	                    maxVideoTokens, tokensPerFrame{mode dynamic|static,
//	                    dynamic{factor}, static{numTokensPerFrame}},
//	                    frames{mode sampled|strided, minFrames, maxFrames,
//	                    sampled{sampleFPS (2), temporalPatchSize},
//	                    strided{defaultSourceFPS (24), frameStride}}}
//	udsTokenizerConfig: object  refused (deprecated upstream)
package tokenproducer
