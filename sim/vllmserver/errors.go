package vllmserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/sim/engine"
)

// apiError is an error the server answers in vLLM's body (ErrorResponse,
// {"error":{"message":...,"type":...,"param":null,"code":status}}, as
// vLLM ≥ 0.10.1). The type names follow the OpenAI SDK's exception
// classes, as vLLM's create_error_response callers pass them.
type apiError struct {
	vllm.ErrorInfo
	// inStream marks a failure vLLM meets while generating (finish_reason
	// "error"): by then a stream's response has begun, so a stream gets it
	// as an event (see refuse).
	inStream bool
}

func newAPIError(status int, format string, args ...any) *apiError {
	typ := "BadRequestError"
	switch status {
	case http.StatusNotFound:
		typ = "NotFoundError"
	case http.StatusTooManyRequests:
		typ = "RateLimitError"
	case http.StatusConflict:
		typ = "ConflictError"
	case http.StatusInternalServerError:
		typ = "InternalServerError"
	}
	return &apiError{ErrorInfo: vllm.ErrorInfo{Message: fmt.Sprintf(format, args...), Type: typ, Code: status}}
}

// kvLoadFailed is the answer to a request whose KV load failed under
// kv_load_failure_policy=fail. vLLM (≥ 0.11.1, PR #26813) finishes the
// request with finish_reason "error" and its OpenAI server raises
// GenerationError("Internal server error"): a 500 InternalServerError, or
// in a stream an error event before [DONE]
// (vllm/entrypoints/openai/completion/serving.py at cc139d8e; its stream
// generators skip an error output that carries no token before raising,
// vllm-project/vllm#40978, and the sim sends the event they mean to). vLLM
// logs the cause; the message here keeps it after vLLM's text.
func kvLoadFailed(err error) *apiError {
	e := newAPIError(http.StatusInternalServerError, "Internal server error: KV load failed (kv_load_failure_policy=fail): %v", err)
	e.inStream = true
	return e
}

func badRequest(format string, args ...any) *apiError {
	return newAPIError(http.StatusBadRequest, format, args...)
}

// engineError maps an engine.Add error to the answer vLLM would give.
func (s *Server) engineError(err error, promptLen, maxTokens int) *apiError {
	switch {
	case errors.Is(err, engine.ErrTooLong):
		return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens "+
			"(%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.engCfg.MaxModelLen, promptLen+maxTokens, promptLen, maxTokens)
	case errors.Is(err, engine.ErrQueueFull):
		return newAPIError(http.StatusTooManyRequests, "The server is overloaded: %d requests are waiting. Retry later.",
			s.engCfg.MaxWaiting)
	case errors.Is(err, engine.ErrInvalidRequest), errors.Is(err, engine.ErrLoRADisabled):
		return badRequest("%v", err)
	default:
		return newAPIError(http.StatusInternalServerError, "%v", err)
	}
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Code, vllm.ErrorResponse{Error: e.ErrorInfo})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value written here is built from marshalable types.
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the response failed","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
