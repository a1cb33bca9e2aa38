package batch

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// AsyncDispatcher sends each line through the async processor's Redis
// request queue (`kvgate async`, llm-d-async's sorted set) instead of
// straight to the gateway: the processor's gates then release batch work
// only into the fleet's slack. The line keeps its identity headers
// (objective, fairness id, request id), as HTTPDispatcher sends them.
type AsyncDispatcher struct {
	Client    *async.Client
	Objective string
	// Window bounds a message whose context has no deadline (the batch's
	// completion window normally gives one); default 24 h.
	Window time.Duration
}

func (d *AsyncDispatcher) Do(ctx context.Context, req *Request) (*Response, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(cmp.Or(d.Window, 24*time.Hour))
	}
	rep, err := d.Client.Do(ctx, async.Call{Path: req.URL, Headers: identityHeaders(req, d.Objective), Body: req.Body, Deadline: deadline})
	if err != nil {
		// No HTTP answer came (an *async.ResultError: deadline, gateway
		// unreachable; or Redis failed): the processor retries it as any
		// unanswered request.
		return nil, fmt.Errorf("async processor: %w", err)
	}
	return &Response{StatusCode: rep.StatusCode, Body: rep.Body}, nil
}

// identityHeaders are what the picker's flow control knows a line by.
func identityHeaders(req *Request, objective string) map[string]string {
	h := map[string]string{eppwire.HeaderRequestID: req.RequestID}
	if objective != "" {
		h[eppwire.HeaderObjective] = objective
	}
	if req.Tenant != "" {
		h[eppwire.HeaderFairnessID] = req.Tenant
	}
	return h
}
