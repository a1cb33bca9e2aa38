package vllm

// ErrorResponse is the error body vLLM's OpenAI server writes (and llm-d's
// sidecar copies): {"object":"error","message":...,"type":...,
// "param":null,"code":status}. The OpenAI SDK raises it by its type.
type ErrorResponse struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func (e *ErrorResponse) Error() string { return e.Message }
