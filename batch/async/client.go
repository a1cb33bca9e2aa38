package async

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is llm-d-async's sorted-set producer with a waiter: Submit
// enqueues messages, Cancel marks them cancelled, and Do enqueues one
// request and waits for its result, so that a caller (kvgate batch) can
// dispatch through the async processor as through an HTTP client.
//
// Do's results come back on the Client's own result list (each message
// names it in result_queue_name), read by one goroutine that hands each
// result to its waiter; the queue's configuration must then not set a
// result_queue_name of its own, which would take precedence.
type Client struct {
	rdb     *redis.Client
	queue   string
	results string
	grace   time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	waiting map[string]chan Result
	stop    context.CancelFunc
	done    chan struct{}
}

// ClientOptions configure a Client.
type ClientOptions struct {
	// Queue is the request sorted set (default request-sortedset).
	Queue string
	// Results is the Client's result list (default a fresh
	// "kvgate-async:results:<random>").
	Results string
	// Grace is how long after a message's deadline Do still waits for its
	// result before it reports the deadline exceeded (the processor drops
	// a message that is dequeued late without a result). Default 30 s.
	Grace  time.Duration
	Logger *slog.Logger
}

// NewClient returns a Client over rdb (which the caller keeps and closes
// after Close).
func NewClient(rdb *redis.Client, o ClientOptions) *Client {
	if o.Queue == "" {
		o.Queue = DefaultRequestQueue
	}
	if o.Results == "" {
		o.Results = "kvgate-async:results:" + token()
	}
	if o.Grace == 0 {
		o.Grace = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{rdb: rdb, queue: o.Queue, results: o.Results, grace: o.Grace, log: o.Logger,
		waiting: map[string]chan Result{}, stop: stop, done: make(chan struct{})}
	go c.read(ctx)
	return c
}

// Close stops the result reader; waiting calls end with an error.
func (c *Client) Close() {
	c.stop()
	<-c.done
}

// ResultList is the list Do's results arrive on.
func (c *Client) ResultList() string { return c.results }

func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Submit enqueues r as llm-d-async's producer does: a fresh request token
// marks the request active until its deadline (clearing any cancel marker
// of an earlier request with the same id), and the envelope enters the
// queue scored by its deadline.
func (c *Client) Submit(ctx context.Context, r Request) error {
	e := &Envelope{Request: r, Kind: KindRedis}
	if err := r.validate(); err != nil {
		return err
	}
	ttl := time.Until(e.DeadlineTime())
	if ttl <= 0 {
		return fmt.Errorf("message %q: deadline %d has passed", r.ID, r.Deadline)
	}
	queue := c.queue
	if r.RequestQueueName != "" {
		queue = r.RequestQueueName
	}
	e.Routing = Routing{RequestQueueName: queue, ResultQueueName: r.ResultQueueName, RequestToken: token()}
	if e.Routing.ResultQueueName == "" {
		e.Routing.ResultQueueName = c.results
	}
	b, err := e.Encode()
	if err != nil {
		return err
	}
	pipe := c.rdb.TxPipeline()
	pipe.Del(ctx, cancelKey(r.ID))
	pipe.Set(ctx, activeKey(r.ID), e.Routing.RequestToken, ttl)
	pipe.ZAdd(ctx, queue, redis.Z{Score: float64(r.Deadline), Member: string(b)})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("enqueue %q: %w", r.ID, err)
	}
	return nil
}

// cancelScript copies a request's active token to its cancel marker
// (llm-d-async's cancellation: only the generation that is active is
// cancelled).
var cancelScript = redis.NewScript(`
local active = redis.call("GET", KEYS[1])
if not active then return 0 end
redis.call("SET", KEYS[2], active, "EX", ARGV[1])
return 1`)

// cancelMarkerTTL is how long a cancel marker outlives the request.
const cancelMarkerTTL = 7 * 24 * time.Hour

// Cancel marks requests cancelled: one not yet dispatched is answered
// CANCELLED instead.
func (c *Client) Cancel(ctx context.Context, ids ...string) error {
	for _, id := range ids {
		if err := cancelScript.Run(ctx, c.rdb, []string{activeKey(id), cancelKey(id)}, int(cancelMarkerTTL/time.Second)).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("cancel %q: %w", id, err)
		}
	}
	return nil
}

// Call is one inference request for Do.
type Call struct {
	// ID is the message id; empty: a fresh one.
	ID string
	// Path overrides the queue's request path (e.g. /v1/chat/completions).
	Path     string
	Headers  map[string]string
	Metadata map[string]string
	// Body is the JSON request object.
	Body []byte
	// Deadline is when the request stops being worth running.
	Deadline time.Time
}

// Reply is the gateway's answer.
type Reply struct {
	StatusCode int
	Body       []byte
}

// ResultError is a result without an HTTP answer (deadline exceeded,
// cancelled, the gateway unreachable).
type ResultError struct {
	Code, Message string
}

func (e *ResultError) Error() string { return fmt.Sprintf("async %s: %s", e.Code, e.Message) }

// Do enqueues call and waits for its result: the gateway's status and
// body (any status: a 4xx is a Reply, not an error), or a *ResultError.
// When ctx ends first the request is cancelled and ctx's error returned.
func (c *Client) Do(ctx context.Context, call Call) (Reply, error) {
	id := call.ID
	if id == "" {
		id = "kvgate-" + token()
	}
	ch := make(chan Result, 1)
	c.mu.Lock()
	if _, dup := c.waiting[id]; dup {
		c.mu.Unlock()
		return Reply{}, fmt.Errorf("message %q is already waiting for its result", id)
	}
	c.waiting[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiting, id)
		c.mu.Unlock()
	}()
	r := Request{ID: id, Created: time.Now().Unix(), Deadline: call.Deadline.Unix(), Payload: json.RawMessage(call.Body),
		Metadata: call.Metadata, Headers: call.Headers, Endpoint: call.Path}
	if err := c.Submit(ctx, r); err != nil {
		return Reply{}, err
	}
	late := time.NewTimer(time.Until(time.Unix(r.Deadline, 0).Add(c.grace)))
	defer late.Stop()
	select {
	case res := <-ch:
		if res.StatusCode > 0 {
			return Reply{StatusCode: res.StatusCode, Body: []byte(res.Payload)}, nil
		}
		return Reply{}, &ResultError{Code: res.ErrorCode, Message: res.ErrorMessage}
	case <-late.C:
		return Reply{}, &ResultError{Code: CodeDeadlineExceeded, Message: "no result by the deadline"}
	case <-c.done:
		return Reply{}, errors.New("async client closed")
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.Cancel(cctx, id); err != nil {
			c.log.Warn("cancel after the caller left", "id", id, "err", err)
		}
		return Reply{}, ctx.Err()
	}
}

// read hands each result on the list to its waiter.
func (c *Client) read(ctx context.Context) {
	defer close(c.done)
	for ctx.Err() == nil {
		v, err := c.rdb.BRPop(ctx, time.Second, c.results).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
				c.log.Warn("reading results", "list", c.results, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		var res Result
		if err := json.Unmarshal([]byte(v[1]), &res); err != nil {
			c.log.Error("unreadable result", "list", c.results, "err", err)
			continue
		}
		c.mu.Lock()
		ch := c.waiting[res.ID]
		c.mu.Unlock()
		if ch == nil {
			c.log.Warn("result nobody waits for (its caller left)", "id", res.ID)
			continue
		}
		select {
		case ch <- res:
		default:
		}
	}
}
