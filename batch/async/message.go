package async

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Request is llm-d-async's request message: what a producer submits.
// Deadline is required; Payload is the inference request body (a JSON
// object) sent as is.
type Request struct {
	ID       string            `json:"id"`
	Created  int64             `json:"created"`  // Unix seconds
	Deadline int64             `json:"deadline"` // Unix seconds
	Payload  json.RawMessage   `json:"payload"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	// Endpoint overrides the queue's request path for this message.
	Endpoint string `json:"endpoint,omitempty"`
	// RequestQueueName and ResultQueueName are a Redis message's own queue
	// overrides (llm-d-async's request kind "redis").
	RequestQueueName string `json:"request_queue_name,omitempty"`
	ResultQueueName  string `json:"result_queue_name,omitempty"`
}

// Routing is the envelope's "internal" object: where the message came from
// and goes, and how often it was retried. Producers and the processor write
// it; callers do not.
type Routing struct {
	RetryCount       int               `json:"retry_count,omitempty"`
	QueueID          string            `json:"queue_id,omitempty"`
	RequestToken     string            `json:"request_token,omitempty"`
	RequestQueueName string            `json:"request_queue_name,omitempty"`
	ResultQueueName  string            `json:"result_queue_name,omitempty"`
	Correlation      string            `json:"transport_correlation_id,omitempty"`
	Labels           map[string]string `json:"labels,omitempty"`
}

// Envelope is one member of a request or retry sorted set: llm-d-async's
// persisted wire format {"internal": Routing, "request_kind": kind, "data":
// Request}, so that its producers and kvgate's Client write the same thing.
type Envelope struct {
	Routing Routing
	Request Request
	// Kind is the request_kind read ("plain", "redis" or "pubsub"); written
	// back unchanged on a retry so that the message keeps its shape.
	Kind string
	// member and held are the processor's: the sorted-set member as popped
	// and the processing set holding it until the message is settled.
	member, held string
}

// Request kinds of llm-d-async's envelope. kvgate's Client writes "redis".
const (
	KindPlain  = "plain"
	KindRedis  = "redis"
	KindPubSub = "pubsub"
)

type wireEnvelope struct {
	Internal    Routing         `json:"internal"`
	RequestKind string          `json:"request_kind"`
	Data        json.RawMessage `json:"data"`
}

// ErrMessage reports a sorted-set member that is not a usable message.
var ErrMessage = errors.New("invalid async message")

// MaxMessageBytes bounds one member the processor decodes.
const MaxMessageBytes = 16 << 20

// DecodeEnvelope parses a sorted-set member: an llm-d-async envelope, or a
// bare request message (what `redis-cli ZADD` users write), which is read
// as kind "plain". The message must have an id and a positive deadline and
// a payload that is a JSON object.
func DecodeEnvelope(b []byte) (*Envelope, error) {
	if len(b) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrMessage, len(b), MaxMessageBytes)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMessage, err)
	}
	e := &Envelope{Kind: KindPlain}
	data := b
	if _, ok := probe["request_kind"]; ok {
		var w wireEnvelope
		if err := json.Unmarshal(b, &w); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMessage, err)
		}
		switch w.RequestKind {
		case KindPlain, KindRedis, KindPubSub:
		default:
			return nil, fmt.Errorf("%w: unknown request_kind %q", ErrMessage, w.RequestKind)
		}
		if len(w.Data) == 0 {
			return nil, fmt.Errorf("%w: no data", ErrMessage)
		}
		e.Routing, e.Kind, data = w.Internal, w.RequestKind, w.Data
	}
	if err := json.Unmarshal(data, &e.Request); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMessage, err)
	}
	if err := e.Request.validate(); err != nil {
		return nil, err
	}
	// The message's own queue overrides become its routing, as
	// llm-d-async's producers merge them.
	if e.Routing.RequestQueueName == "" {
		e.Routing.RequestQueueName = e.Request.RequestQueueName
	}
	if e.Routing.ResultQueueName == "" {
		e.Routing.ResultQueueName = e.Request.ResultQueueName
	}
	return e, nil
}

func (r *Request) validate() error {
	switch {
	case r.ID == "":
		return fmt.Errorf("%w: id is required", ErrMessage)
	case r.Deadline <= 0:
		return fmt.Errorf("%w: message %q: deadline must be a positive Unix time in seconds, got %d", ErrMessage, r.ID, r.Deadline)
	}
	p := bytes.TrimSpace(r.Payload)
	if len(p) == 0 || p[0] != '{' {
		return fmt.Errorf("%w: message %q: payload must be a JSON object", ErrMessage, r.ID)
	}
	return nil
}

// Encode writes the envelope in llm-d-async's wire format.
func (e *Envelope) Encode() ([]byte, error) {
	kind := e.Kind
	if kind == "" {
		kind = KindRedis
	}
	data, err := json.Marshal(&e.Request)
	if err != nil {
		return nil, err
	}
	return json.Marshal(wireEnvelope{Internal: e.Routing, RequestKind: kind, Data: data})
}

// DeadlineTime is the message's deadline.
func (e *Envelope) DeadlineTime() time.Time { return time.Unix(e.Request.Deadline, 0) }

// Expired reports whether the deadline passed before now (llm-d-async
// compares whole seconds: a message is live through its deadline second).
func (e *Envelope) Expired(now time.Time) bool { return e.Request.Deadline < now.Unix() }

// Result is one entry of the result list: llm-d-async's result message.
// StatusCode > 0: the gateway answered and Payload is its body; 0: no
// answer, ErrorCode and ErrorMessage say why (Payload then holds
// {"error": message} for readers of Payload alone).
type Result struct {
	ID           string `json:"id"`
	StatusCode   int    `json:"status_code,omitempty"`
	Payload      string `json:"payload"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

// Result error codes (llm-d-async's).
const (
	CodeDeadlineExceeded = "DEADLINE_EXCEEDED"
	CodeCancelled        = "CANCELLED"
	CodeGateError        = "GATE_ERROR"
	CodeInferenceError   = "INFERENCE_ERROR"
	CodeInvalidRequest   = "INVALID_REQUEST"
)

func errorResult(id, code, msg string) Result {
	p, _ := json.Marshal(map[string]string{"error": msg})
	return Result{ID: id, Payload: string(p), ErrorCode: code, ErrorMessage: msg}
}

// Redis keys of llm-d-async's per-request cancellation: the producer sets
// request-active:<id> to the request's token; a cancel copies it to
// request-cancel:<id>; a message whose token matches the cancel marker is
// answered CANCELLED instead of dispatched.
func activeKey(id string) string { return "request-active:" + id }
func cancelKey(id string) string { return "request-cancel:" + id }
