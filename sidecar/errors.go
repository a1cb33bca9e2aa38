package sidecar

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/kvgate/kvgate/internal/vllm"
)

// apiError is the error body llm-d's sidecar writes, vLLM's flat one of
// before v0.10.1: {"object":"error","message":...,"type":...,"param":null,
// "code":status}. The sidecar answers in that shape so that a client sees
// llm-d's errors; the model server's own errors pass through as they came.
type apiError = vllm.FlatErrorResponse

// errorType names an error status as llm-d's sidecar does.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusForbidden:
		return "Forbidden"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLarge"
	case http.StatusBadGateway:
		return "BadGateway"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	case http.StatusGatewayTimeout:
		return "GatewayTimeout"
	default:
		return "InternalServerError"
	}
}

func newError(status int, format string, args ...any) *apiError {
	return &apiError{Object: "error", ErrorInfo: vllm.ErrorInfo{Message: fmt.Sprintf(format, args...), Type: errorType(status), Code: status}}
}

// errDecoderDown is llm-d's canned answer when the local model server
// cannot be reached.
func errDecoderDown() *apiError {
	return newError(http.StatusServiceUnavailable,
		"The decode node is not ready. Please check that the vLLM service is running and the port configuration is correct.")
}

func writeError(w http.ResponseWriter, e *apiError) {
	b, _ := json.Marshal(e) // only strings and ints
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	w.WriteHeader(e.Code)
	_, _ = w.Write(b)
}
