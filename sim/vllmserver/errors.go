package vllmserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/sim/engine"
)

// apiError is vLLM's error body: {"object":"error","message":...,
// "type":...,"param":null,"code":status}. The type names follow the OpenAI
// SDK's exception classes, as vLLM's create_error_response callers pass
// them; a 503 has the type vLLM's HTTPException handler gives every
// status it raises, the status's HTTP phrase (HTTPStatus(code).phrase).
type apiError = vllm.ErrorResponse

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
	case http.StatusServiceUnavailable:
		typ = "Service Unavailable"
	}
	return &apiError{Object: "error", Message: fmt.Sprintf(format, args...), Type: typ, Code: status}
}

// kvLoadFailed is the answer to a request whose KV load failed under
// kv_load_failure_policy=fail.
func kvLoadFailed(err error) *apiError {
	return newAPIError(http.StatusServiceUnavailable, "KV load failed (kv_load_failure_policy=fail): %v", err)
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

func writeError(w http.ResponseWriter, e *apiError) { writeJSON(w, e.Code, e) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value written here is built from marshalable types.
		status, b = http.StatusInternalServerError, []byte(`{"object":"error","message":"encoding the response failed","type":"InternalServerError","param":null,"code":500}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
