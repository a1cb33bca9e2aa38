package async

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Options configure a Processor.
type Options struct {
	Config Config
	// Concurrency is the number of workers, each holding one request in
	// flight (--concurrency, default 64).
	Concurrency int
	// RequestTimeout bounds one attempt (and never past the deadline).
	RequestTimeout time.Duration
	// DrainTimeout is how long in-flight requests may finish at shutdown;
	// the rest go back to the retry queue, due at once.
	DrainTimeout time.Duration
	// Redelivery is how long a popped message may stay unsettled (no
	// result, not back in a queue) before it is put back in its queue: the
	// processor that held it was killed. Default 2 × RequestTimeout + 30 s.
	Redelivery time.Duration
	// Backoff schedules retries; zero: llm-d-async's.
	Backoff Backoff
	// Gates builds each queue's gate; nil builds gates without Prometheus.
	Gates *Factory
	// HTTP sends the requests to the gateway.
	HTTP       *http.Client
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Defaults of llm-d-async's flags.
const (
	DefaultConcurrency    = 64
	DefaultRequestTimeout = 5 * time.Minute
	DefaultDrainTimeout   = 2 * time.Minute
	// MaxConcurrency bounds the worker goroutines.
	MaxConcurrency = 65536
	// maxResultBytes bounds a response body kept as a result's payload.
	maxResultBytes = 64 << 20
)

// Processor consumes request sorted sets and dispatches their messages to
// the gateway through each queue's gate: llm-d-async's redis-sortedset
// transport. It owns its Redis client and its workers.
//
// A message is in exactly one place at a time: its request set, the retry
// set, the queue's processing set (ProcessingKey: popped by a processor,
// scored by when it is redelivered if still there), or, as its result, the
// result list. Every move out of the processing set is one MULTI with the
// move into the next place, so a processor killed at any moment leaves each
// message either settled or in the processing set, from which Run (of this
// or another processor) returns it to its queue after Redelivery: every
// message gets exactly one result; a request cut off by the kill is sent
// again.
type Processor struct {
	cfg    Config
	opts   Options
	rdb    *redis.Client
	queues []*pqueue
	byName map[string]*pqueue
	work   chan work
	m      *Metrics
	log    *slog.Logger

	rndMu sync.Mutex
	rnd   *rand.Rand
}

type pqueue struct {
	cfg  QueueConfig
	gate Gate
	m    *queueMetrics
}

type work struct {
	q       *pqueue
	m       *Envelope
	release func()
	popped  time.Time
}

func redisOptions(u string) (*redis.Options, error) { return redis.ParseURL(u) }

// ProcessingKey is the sorted set holding a queue's popped, unsettled
// messages (kvgate's; llm-d-async pops without one).
func ProcessingKey(queue string) string { return queue + ":processing" }

// popScript moves the earliest-deadline member into the processing set,
// scored by its redelivery time.
var popScript = redis.NewScript(`
local r = redis.call("ZPOPMIN", KEYS[1], 1)
if #r == 0 then return false end
redis.call("ZADD", KEYS[2], ARGV[1], r[1])
return r[1]`)

// New validates opts and builds the queues' gates; Run starts it.
func New(opts Options) (*Processor, error) {
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.Concurrency < 1 || opts.Concurrency > MaxConcurrency {
		return nil, fmt.Errorf("concurrency must be 1..%d, got %d", MaxConcurrency, opts.Concurrency)
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.Redelivery == 0 {
		opts.Redelivery = 2*opts.RequestTimeout + 30*time.Second
	}
	if opts.RequestTimeout < 0 || opts.DrainTimeout < 0 || opts.Redelivery < 0 {
		return nil, errors.New("request, drain and redelivery timeouts must not be negative")
	}
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{}
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Gates == nil {
		opts.Gates = &Factory{}
	}
	m, err := NewMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	m.workers.WithLabelValues(DefaultWorkerPool).Set(float64(opts.Concurrency))
	ro, err := redisOptions(opts.Config.URL)
	if err != nil {
		return nil, err
	}
	p := &Processor{cfg: opts.Config, opts: opts, m: m, log: opts.Logger, byName: map[string]*pqueue{},
		work: make(chan work), rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0xa5c))}
	for _, qc := range opts.Config.Queues {
		q := &pqueue{cfg: qc, m: m.queue(qc.ID, qc.QueueName, qc.WorkerPoolID)}
		f := *opts.Gates
		f.Observer = q.m.observer
		if q.gate, err = f.New(GateConfig{GateType: qc.GateType, GateParams: qc.GateParams}); err != nil {
			return nil, fmt.Errorf("queue %q: %w", qc.QueueName, err)
		}
		p.queues = append(p.queues, q)
		p.byName[qc.QueueName] = q
	}
	p.rdb = redis.NewClient(ro)
	return p, nil
}

// Run polls and dispatches until ctx ends, then stops polling, lets
// in-flight requests finish for DrainTimeout and re-queues the rest. It
// closes the Redis client before returning.
func (p *Processor) Run(ctx context.Context) error {
	defer p.rdb.Close()
	if err := p.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	var workers, pollers sync.WaitGroup
	for range p.opts.Concurrency {
		workers.Go(func() {
			for w := range p.work {
				p.process(reqCtx, w)
			}
		})
	}
	for _, q := range p.queues {
		pollers.Go(func() { p.poll(ctx, q) })
	}
	pollers.Go(func() { p.moveRetries(ctx) })
	p.log.Info("async processor started", "queues", len(p.queues), "workers", p.opts.Concurrency)
	<-ctx.Done()
	pollers.Wait()
	close(p.work)
	drained := make(chan struct{})
	go func() { workers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(p.opts.DrainTimeout):
		p.log.Warn("drain timeout: re-queueing in-flight requests", "timeout", p.opts.DrainTimeout)
		cancelReqs()
		<-drained
	}
	return nil
}

func (p *Processor) poll(ctx context.Context, q *pqueue) {
	t := time.NewTicker(p.cfg.PollInterval())
	defer t.Stop()
	rq := &redisQueue{p: p, q: q}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, err := Poll(ctx, time.Now(), q.gate, p.cfg.BatchSize, rq)
		if err != nil && ctx.Err() == nil {
			p.log.Error("poll", "queue", q.cfg.QueueName, "err", err)
		}
		n, cerr := p.rdb.ZCard(ctx, q.cfg.QueueName).Result()
		if cerr == nil {
			q.m.backlog.Set(float64(n))
		}
		q.m.round(r, n > 0)
	}
}

// redisQueue is one queue's sorted set as Poll sees it.
type redisQueue struct {
	p *Processor
	q *pqueue
}

func (rq *redisQueue) Pop(ctx context.Context) (*Envelope, error) {
	p, q := rq.p, rq.q
	held := ProcessingKey(q.cfg.QueueName)
	for {
		until := float64(time.Now().Add(p.opts.Redelivery).UnixMilli()) / 1000
		member, err := popScript.Run(ctx, p.rdb, []string{q.cfg.QueueName, held}, until).Text()
		if err != nil {
			if errors.Is(err, redis.Nil) {
				err = nil
			}
			return nil, err
		}
		m, err := DecodeEnvelope([]byte(member))
		if err != nil {
			// Nothing can answer a message without a usable id or deadline.
			p.log.Error("dropping unreadable message", "queue", q.cfg.QueueName, "err", err, "member", truncate(member, 200))
			q.m.failed.Inc()
			p.rdb.ZRem(ctx, held, member)
			continue
		}
		m.member, m.held = member, held
		if m.Routing.RequestQueueName == "" {
			m.Routing.RequestQueueName = q.cfg.QueueName
		}
		if m.Routing.QueueID == "" {
			m.Routing.QueueID = q.cfg.ID
		}
		for k, v := range q.cfg.Labels {
			if m.Routing.Labels == nil {
				m.Routing.Labels = map[string]string{}
			}
			m.Routing.Labels[k] = v
		}
		if tok := m.Routing.RequestToken; tok != "" {
			c, err := p.rdb.Get(ctx, cancelKey(m.Request.ID)).Result()
			if err == nil && c == tok {
				p.finish(ctx, q, m, errorResult(m.Request.ID, CodeCancelled, "cancelled"))
				continue
			}
			if err != nil && !errors.Is(err, redis.Nil) {
				// Best effort here; a cancel seen later still wins over a retry.
				p.log.Warn("cancellation check", "id", m.Request.ID, "err", err)
			}
		}
		return m, nil
	}
}

func (rq *redisQueue) Requeue(ctx context.Context, m *Envelope) error {
	return rq.p.zadd(ctx, rq.q.cfg.QueueName, float64(m.Request.Deadline), m)
}

func (rq *redisQueue) Expire(ctx context.Context, m *Envelope) {
	rq.p.log.Info("deadline expired at dequeue: dropped", "id", m.Request.ID, "queue", rq.q.cfg.QueueName)
	if err := rq.p.rdb.ZRem(ctx, m.held, m.member).Err(); err != nil {
		rq.p.log.Warn("settling a dropped message", "id", m.Request.ID, "err", err)
	}
	rq.p.cleanup(ctx, m)
}

func (rq *redisQueue) Dispatch(ctx context.Context, m *Envelope, release func()) error {
	rq.q.m.depth.Inc()
	select {
	case rq.p.work <- work{q: rq.q, m: m, release: release, popped: time.Now()}:
		return nil
	case <-ctx.Done():
		rq.q.m.depth.Dec()
		// Stopping: the message goes back where it came from.
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := rq.Requeue(bg, m); err != nil {
			rq.p.log.Error("re-queueing at shutdown failed: message lost", "id", m.Request.ID, "err", err)
		}
		return ctx.Err()
	}
}

// zadd moves m into the sorted set key, out of its processing set.
func (p *Processor) zadd(ctx context.Context, key string, score float64, m *Envelope) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	tx := p.rdb.TxPipeline()
	tx.ZAdd(ctx, key, redis.Z{Score: score, Member: string(b)})
	p.settle(ctx, tx, m)
	_, err = tx.Exec(ctx)
	return err
}

// settle adds the removal of m from its processing set to tx.
func (p *Processor) settle(ctx context.Context, tx redis.Pipeliner, m *Envelope) {
	if m.held != "" {
		tx.ZRem(ctx, m.held, m.member)
	}
}

// process sends one message and settles it: a result, or a retry.
func (p *Processor) process(ctx context.Context, w work) {
	q, m := w.q, w.m
	q.m.depth.Dec()
	q.m.residence.Observe(float64(time.Since(w.popped).Milliseconds()))
	defer w.release()
	if m.Routing.RetryCount == 0 {
		q.m.requests.Inc()
	}
	q.m.inflight.Inc()
	defer q.m.inflight.Dec()
	deadline := m.DeadlineTime()
	if time.Now().After(deadline) {
		q.m.expired.Inc()
		p.finish(ctx, q, m, errorResult(m.Request.ID, CodeDeadlineExceeded, "deadline exceeded"))
		return
	}
	start := time.Now()
	status, body, retryAfter, err := p.send(ctx, q, m)
	q.m.inference.Observe(float64(time.Since(start).Milliseconds()))
	switch {
	case err != nil && ctx.Err() != nil:
		// Shutdown cut the attempt: due again at once, not counted as a retry.
		p.requeueRetry(q, m, 0)
	case err != nil && !time.Now().Before(deadline):
		q.m.expired.Inc()
		p.finish(ctx, q, m, errorResult(m.Request.ID, CodeDeadlineExceeded, "deadline exceeded: "+err.Error()))
	case err != nil:
		q.m.failed.Inc()
		p.finish(ctx, q, m, errorResult(m.Request.ID, CodeInferenceError, "failed to send request to inference: "+err.Error()))
	case status == http.StatusTooManyRequests || status >= 500:
		if status == http.StatusTooManyRequests {
			q.m.shed.Inc()
		}
		p.retry(ctx, q, m, retryAfter, Result{ID: m.Request.ID, StatusCode: status, Payload: string(body)})
	case status >= 400:
		q.m.failed.Inc()
		p.finish(ctx, q, m, Result{ID: m.Request.ID, StatusCode: status, Payload: string(body)})
	default:
		q.m.ok.Inc()
		p.finish(ctx, q, m, Result{ID: m.Request.ID, StatusCode: status, Payload: string(body)})
	}
}

// send makes one attempt.
func (p *Processor) send(ctx context.Context, q *pqueue, m *Envelope) (status int, body []byte, retryAfter time.Duration, err error) {
	path := q.cfg.RequestPathURL
	if m.Request.Endpoint != "" {
		path = m.Request.Endpoint
	}
	u, err := url.JoinPath(q.cfg.IGWBaseURL, path)
	if err != nil {
		return 0, nil, 0, err
	}
	ctx, cancel := context.WithDeadline(ctx, minTime(time.Now().Add(p.opts.RequestTimeout), m.DeadlineTime()))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(m.Request.Payload))
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if q.cfg.InferenceObjective != "" {
		req.Header.Set(HeaderInferenceObjective, q.cfg.InferenceObjective)
	}
	for k, v := range m.Request.Headers {
		req.Header.Set(k, v)
	}
	// The tenant the fairness id names is the message's userid, whatever
	// the caller's headers said (llm-d-async stamps it after them).
	if v := m.Request.Metadata[FairnessAttribute]; v != "" && len(v) <= 256 {
		req.Header.Set(HeaderFairnessID, v)
	}
	resp, err := p.opts.HTTP.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, maxResultBytes+1))
	if err == nil && len(body) > maxResultBytes {
		err = fmt.Errorf("response body over %d bytes", maxResultBytes)
	}
	if err != nil {
		// A response cut short is the server's failure: retryable.
		return http.StatusBadGateway, nil, 0, nil
	}
	return resp.StatusCode, body, parseRetryAfter(resp.Header.Get("Retry-After")), nil
}

func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// retry schedules the next attempt in the retry set, or, with the
// deadline spent, gives the last answer as the final result.
func (p *Processor) retry(ctx context.Context, q *pqueue, m *Envelope, retryAfter time.Duration, last Result) {
	p.rndMu.Lock()
	d, ok := p.opts.Backoff.Delay(m.Routing.RetryCount+1, time.Until(m.DeadlineTime()), retryAfter, p.rnd.Float64)
	p.rndMu.Unlock()
	if !ok {
		q.m.expired.Inc()
		p.finish(ctx, q, m, last)
		return
	}
	m.Routing.RetryCount++
	q.m.retries.Inc()
	p.requeueRetry(q, m, d)
}

func (p *Processor) requeueRetry(q *pqueue, m *Envelope, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	due := float64(time.Now().Add(d).UnixMilli()) / 1000
	if err := p.zadd(ctx, p.cfg.RetryQueueName, due, m); err != nil {
		p.log.Error("retry enqueue failed: message lost", "id", m.Request.ID, "queue", q.cfg.QueueName, "err", err)
	}
}

// finish pushes the result and clears the message's cancellation keys.
func (p *Processor) finish(ctx context.Context, q *pqueue, m *Envelope, r Result) {
	list := q.cfg.ResultQueueName
	if list == "" {
		list = m.Routing.ResultQueueName
	}
	if list == "" {
		list = p.cfg.ResultQueueName
	}
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(errorResult(r.ID, CodeInferenceError, "result not encodable"))
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	tx := p.rdb.TxPipeline()
	tx.LPush(wctx, list, string(b))
	p.settle(wctx, tx, m)
	if _, err := tx.Exec(wctx); err != nil {
		p.log.Error("result push failed: the message is redelivered", "id", r.ID, "list", list, "err", err)
		return
	}
	p.cleanup(wctx, m)
}

// cleanupScript deletes a request's active and cancel markers when they
// still hold this generation's token (a resubmission with the same id has
// its own).
var cleanupScript = redis.NewScript(`
if ARGV[1] == "" then return 0 end
if redis.call("GET", KEYS[1]) == ARGV[1] then redis.call("DEL", KEYS[1]) end
if redis.call("GET", KEYS[2]) == ARGV[1] then redis.call("DEL", KEYS[2]) end
return 1`)

func (p *Processor) cleanup(ctx context.Context, m *Envelope) {
	if m.Routing.RequestToken == "" {
		return
	}
	if err := cleanupScript.Run(ctx, p.rdb, []string{activeKey(m.Request.ID), cancelKey(m.Request.ID)}, m.Routing.RequestToken).Err(); err != nil && !errors.Is(err, redis.Nil) {
		p.log.Warn("request state cleanup", "id", m.Request.ID, "err", err)
	}
}

// moveRetries returns due retries to their request sets, scored by their
// deadlines again.
func (p *Processor) moveRetries(ctx context.Context) {
	t := time.NewTicker(p.cfg.PollInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.moveDue(ctx, p.cfg.RetryQueueName, "")
		for _, q := range p.queues {
			p.moveDue(ctx, ProcessingKey(q.cfg.QueueName), q.cfg.QueueName)
		}
	}
}

// moveDue returns the members of from whose time has come to their request
// set (to, or the one their routing names), scored by their deadlines:
// due retries, and messages whose processor stopped holding them.
func (p *Processor) moveDue(ctx context.Context, from, to string) {
	now := strconv.FormatFloat(float64(time.Now().UnixMilli())/1000, 'f', 3, 64)
	due, err := p.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: from, ByScore: true, Start: "-inf", Stop: now, Count: int64(p.cfg.BatchSize)}).Result()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Error("reading due messages", "set", from, "err", err)
		}
		return
	}
	for _, member := range due {
		m, err := DecodeEnvelope([]byte(member))
		if err != nil {
			p.log.Error("dropping an unreadable message", "set", from, "err", err, "member", truncate(member, 200))
			p.rdb.ZRem(ctx, from, member)
			continue
		}
		key := to
		if key == "" {
			key = m.Routing.RequestQueueName
		}
		if p.byName[key] == nil {
			key = p.queues[0].cfg.QueueName
		}
		if to != "" {
			p.log.Warn("redelivering a message its processor left unsettled", "id", m.Request.ID, "queue", key)
		}
		// Only the processor whose ZREM removes it moves it (several may
		// share the sets); both in one step, so that it is never lost.
		if err := moveScript.Run(ctx, p.rdb, []string{from, key}, member, m.Request.Deadline).Err(); err != nil && !errors.Is(err, redis.Nil) {
			p.log.Error("moving a due message", "id", m.Request.ID, "set", from, "err", err)
		}
	}
}

var moveScript = redis.NewScript(`
if redis.call("ZREM", KEYS[1], ARGV[1]) == 1 then
  redis.call("ZADD", KEYS[2], ARGV[2], ARGV[1])
  return 1
end
return 0`)

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
