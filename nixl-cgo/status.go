package nixl

import (
	"errors"
	"fmt"
)

// Status is NIXL's nixl_status_t (the C++ core's codes).
type Status int

const (
	InProg              Status = 1
	Success             Status = 0
	ErrNotPosted        Status = -1
	ErrInvalidParam     Status = -2
	ErrBackend          Status = -3
	ErrNotFound         Status = -4
	ErrMismatch         Status = -5
	ErrNotAllowed       Status = -6
	ErrRepostActive     Status = -7
	ErrUnknown          Status = -8
	ErrNotSupported     Status = -9
	ErrRemoteDisconnect Status = -10
	ErrCanceled         Status = -11
	ErrNoTelemetry      Status = -12
)

var statusNames = map[Status]string{
	InProg: "NIXL_IN_PROG", Success: "NIXL_SUCCESS", ErrNotPosted: "NIXL_ERR_NOT_POSTED",
	ErrInvalidParam: "NIXL_ERR_INVALID_PARAM", ErrBackend: "NIXL_ERR_BACKEND",
	ErrNotFound: "NIXL_ERR_NOT_FOUND", ErrMismatch: "NIXL_ERR_MISMATCH",
	ErrNotAllowed: "NIXL_ERR_NOT_ALLOWED", ErrRepostActive: "NIXL_ERR_REPOST_ACTIVE",
	ErrUnknown: "NIXL_ERR_UNKNOWN", ErrNotSupported: "NIXL_ERR_NOT_SUPPORTED",
	ErrRemoteDisconnect: "NIXL_ERR_REMOTE_DISCONNECT", ErrCanceled: "NIXL_ERR_CANCELED",
	ErrNoTelemetry: "NIXL_ERR_NO_TELEMETRY",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("NIXL_STATUS(%d)", int(s))
}

// Error is a failed NIXL operation. errors.Is(err, nixl.ErrNotFound) and the
// other Status values match on the code.
type Error struct {
	Op     string // the agent call, e.g. "createXferReq"
	Status Status
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("nixl %s: %s: %s", e.Op, e.Status, e.Msg) }

// Is makes errors.Is(err, nixl.ErrX) work for a Status target.
func (e *Error) Is(target error) bool {
	var s statusError
	if errors.As(target, &s) {
		return Status(s) == e.Status
	}
	return false
}

// statusError lets a Status be used as an errors.Is target.
type statusError Status

func (s statusError) Error() string { return Status(s).String() }

// Error makes a Status usable as an errors.Is target: errors.Is(err,
// nixl.ErrNotFound.Err()).
func (s Status) Err() error { return statusError(s) }

// StatusOf is the Status an error carries: Success for nil, ErrUnknown for
// an error that is not a NIXL one.
func StatusOf(err error) Status {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return ErrUnknown
}

func errorf(op string, st Status, format string, args ...any) error {
	return &Error{Op: op, Status: st, Msg: fmt.Sprintf(format, args...)}
}
