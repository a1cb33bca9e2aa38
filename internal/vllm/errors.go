package vllm

// ErrorInfo is one error as vLLM's OpenAI server describes it: the
// message, the type (the OpenAI SDK's exception class, or the HTTP phrase
// of a status vLLM raises), param, and code (the HTTP status).
type ErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// ErrorResponse is the error body vLLM has written since v0.10.1
// (vllm-project/vllm PR #22099; ErrorResponse{error: ErrorInfo} in
// vllm/entrypoints/openai/engine/protocol.py at d7e52523), the OpenAI
// API's shape: {"error":{"message":...,"type":...,"param":null,
// "code":status}}. Inside a stream it is one event's data.
type ErrorResponse struct {
	Error ErrorInfo `json:"error"`
}

// FlatErrorResponse is the body vLLM wrote before v0.10.1, which llm-d's
// routing sidecar still writes for its own errors:
// {"object":"error","message":...,"type":...,"param":null,"code":status}.
type FlatErrorResponse struct {
	Object string `json:"object"`
	ErrorInfo
}
