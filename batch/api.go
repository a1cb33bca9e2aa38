package batch

import (
	"encoding/json"
	"net/http"
)

// Objects of the OpenAI Files and Batch APIs, field for field. Unset
// timestamps and ids are null, as OpenAI sends them.

// File is OpenAI's file object.
type File struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"`
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	ExpiresAt     *int64  `json:"expires_at"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`
}

// File purposes kvgate batch stores. OpenAI's others (assistants, vision,
// fine-tune, user_data, evals) are accepted and stored, not interpreted.
const (
	PurposeBatch       = "batch"
	PurposeBatchOutput = "batch_output"
)

var validPurposes = map[string]bool{
	PurposeBatch: true, PurposeBatchOutput: true, "assistants": true, "assistants_output": true,
	"fine-tune": true, "fine-tune-results": true, "vision": true, "user_data": true, "evals": true,
}

// Batch statuses (OpenAI's).
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// final reports whether a status is terminal.
func final(status string) bool {
	switch status {
	case StatusCompleted, StatusFailed, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// Batch is OpenAI's batch object.
type Batch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *BatchErrors      `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Usage            Usage             `json:"usage"`
	Metadata         map[string]string `json:"metadata"`
	Model            *string           `json:"model"`
}

// RequestCounts counts a batch's lines.
type RequestCounts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

// Usage totals the token usage of a batch's successful lines.
type Usage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

func (u *Usage) add(o Usage) {
	u.InputTokens += o.InputTokens
	u.InputTokensDetails.CachedTokens += o.InputTokensDetails.CachedTokens
	u.OutputTokens += o.OutputTokens
	u.OutputTokensDetails.ReasoningTokens += o.OutputTokensDetails.ReasoningTokens
	u.TotalTokens += o.TotalTokens
}

// BatchErrors is a failed batch's validation errors.
type BatchErrors struct {
	Object string       `json:"object"`
	Data   []BatchError `json:"data"`
}

// BatchError is one validation error; Line is 1-based.
type BatchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// list is OpenAI's cursor page.
type list[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// Input and output lines of a batch.

// inputLine is one line of a batch input file.
type inputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// outputLine is one line of an output or error file: a request that got an
// answer has Response (a non-2xx one goes to the error file), one that never
// ran has Error.
type outputLine struct {
	ID       string        `json:"id"`
	CustomID string        `json:"custom_id"`
	Response *lineResponse `json:"response"`
	Error    *lineError    `json:"error"`
}

type lineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type lineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes of lines that never ran.
const (
	CodeExpired   = "batch_expired"
	CodeCancelled = "batch_cancelled"
	CodeFailed    = "batch_failed"
)

// apiError is OpenAI's error envelope.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func strp(s string) *string { return &s }

func invalid(param, code, msg string) *apiError {
	e := &apiError{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error"}
	if param != "" {
		e.Param = strp(param)
	}
	if code != "" {
		e.Code = strp(code)
	}
	return e
}

func notFound(param, msg string) *apiError {
	e := invalid(param, "", msg)
	e.Status = http.StatusNotFound
	return e
}
