// Package inferr defines the picker's typed errors: the error codes of the
// Gateway API Inference Extension, their HTTP status, and the
// "inference error: <code> - <message>" body the proxy returns to clients.
package inferr

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is an error code as llm-d's picker names it (GIE's older names
// where llm-d has none).
type Code string

// The codes the picker returns, with the HTTP status each maps to.
// ResourceExhausted is llm-d's name of GIE's InferencePoolResourceExhausted.
const (
	BadRequest         Code = "BadRequest"         // 400
	Unauthorized       Code = "Unauthorized"       // 401
	Forbidden          Code = "Forbidden"          // 403
	NotFound           Code = "NotFound"           // 404
	PreconditionFailed Code = "PreconditionFailed" // 412
	BadResponse        Code = "BadResponse"        // 502
	Internal           Code = "Internal"           // 500
	ServiceUnavailable Code = "ServiceUnavailable" // 503
	ModelServerError   Code = "ModelServerError"   // 502
	ResourceExhausted  Code = "ResourceExhausted"  // 429
	BadConfiguration   Code = "BadConfiguration"   // 404
)

// Error is an error the client sees as an HTTP response.
type Error struct {
	Code Code
	Msg  string
	// DroppedReason, when set, is sent as x-llm-d-request-dropped-reason.
	DroppedReason string
	// Status overrides the code's default HTTP status (0 = default), for the
	// few cases where GIE answers a code with another status.
	Status int
}

func (e *Error) Error() string { return fmt.Sprintf("inference error: %s - %s", e.Code, e.Msg) }

// HTTPStatus is the status the client receives.
func (e *Error) HTTPStatus() int {
	if e.Status != 0 {
		return e.Status
	}
	switch e.Code {
	case BadRequest:
		return http.StatusBadRequest
	case BadResponse, ModelServerError:
		return http.StatusBadGateway
	case ServiceUnavailable:
		return http.StatusServiceUnavailable
	case ResourceExhausted:
		return http.StatusTooManyRequests
	case Unauthorized:
		return http.StatusUnauthorized
	case Forbidden:
		return http.StatusForbidden
	case NotFound:
		return http.StatusNotFound
	case PreconditionFailed:
		return http.StatusPreconditionFailed
	case BadConfiguration:
		return http.StatusNotFound
	default:
		return http.StatusInternalServerError
	}
}

// New returns an *Error with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// As returns err as an *Error; anything else becomes Internal.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: Internal, Msg: err.Error()}
}
