package batch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// Request is one batch line to run.
type Request struct {
	// BatchID, CustomID and Tenant say whose line it is.
	BatchID, CustomID, Tenant string
	// RequestID identifies this line's request downstream (x-request-id).
	RequestID string
	Model     string
	// Method and URL are the line's; URL is a path such as /v1/chat/completions.
	Method, URL string
	Body        []byte
}

// Response is a model server's (or the gateway's) answer.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

// Dispatcher runs one request. An error means no answer came (the
// processor retries it); any HTTP status is a Response. The processor owns
// retries, limits and deadlines; a Dispatcher only delivers.
type Dispatcher interface {
	Do(ctx context.Context, req *Request) (*Response, error)
}

// HTTPDispatcher sends requests through a kvgate gateway (or any
// OpenAI-compatible base URL) with the batch's flow-control identity: the
// InferenceObjective the operator gave a sheddable priority, and the tenant
// as the fairness id.
type HTTPDispatcher struct {
	// Base is the gateway's URL, e.g. http://gateway:8080.
	Base string
	// Objective names the InferenceObjective sent as
	// x-llm-d-inference-objective ("" sends none).
	Objective string
	// Client does the requests; nil is a client without a total timeout.
	Client *http.Client
	// MaxResponseBytes bounds a response body.
	MaxResponseBytes int64
}

func (d *HTTPDispatcher) Do(ctx context.Context, req *Request) (*Response, error) {
	hreq, err := http.NewRequestWithContext(ctx, req.Method, strings.TrimRight(d.Base, "/")+req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(eppwire.HeaderRequestID, req.RequestID)
	if d.Objective != "" {
		hreq.Header.Set(eppwire.HeaderObjective, d.Objective)
	}
	if req.Tenant != "" {
		hreq.Header.Set(eppwire.HeaderFairnessID, req.Tenant)
	}
	c := d.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	limit := d.MaxResponseBytes
	if limit <= 0 {
		limit = 64 << 20
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("response larger than %d bytes", limit)
	}
	return &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// retryable reports whether a status asks to be tried again later: the
// gateway's and picker's "saturated, come back" answers.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// backoff is the wait before attempt n+1 after n refusals: doubling from
// base up to most, the upper half jittered; a longer Retry-After (seconds)
// wins, up to most.
func backoff(n int, base, most time.Duration, retryAfter string, rnd func(int64) int64) time.Duration {
	d := base << min(n-1, 30)
	if d <= 0 || d > most {
		d = most
	}
	d = d/2 + time.Duration(rnd(int64(d/2)+1))
	if s, err := time.ParseDuration(strings.TrimSpace(retryAfter) + "s"); err == nil && s > d {
		d = min(s, most)
	}
	return d
}
