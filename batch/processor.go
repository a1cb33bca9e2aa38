package batch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	Store      Store
	Blobs      *Blobs
	Dispatcher Dispatcher
	// JournalDir holds the journals of running jobs (on the same shared
	// filesystem as Blobs in Redis mode, so another replica can resume).
	JournalDir string
	// Owner names this processor in leases; unique per process.
	Owner    string
	LeaseTTL time.Duration
	// Jobs is how many batches run at once.
	Jobs int
	// MaxConcurrency bounds the requests in flight over all jobs;
	// MaxModelConcurrency those to one model, over all jobs too.
	MaxConcurrency, MaxModelConcurrency int
	MaxLines                            int
	// MaxAttempts bounds the tries of a line refused with 429/503 or
	// without an answer; RetryBase and RetryMax shape the backoff.
	MaxAttempts         int
	RetryBase, RetryMax time.Duration
	// Poll is how often a running job checks for a cancel and saves its
	// counts.
	Poll   time.Duration
	Logger *slog.Logger
	// Registry receives the processor's metrics; nil: not exported.
	Registry prometheus.Registerer
}

// Processor runs the queued batches.
type Processor struct {
	c       ProcessorConfig
	global  chan struct{}
	models  *modelSlots
	m       *metrics
	mu      sync.Mutex
	running map[string]bool
}

func NewProcessor(c ProcessorConfig) (*Processor, error) {
	if err := os.MkdirAll(c.JournalDir, 0o755); err != nil {
		return nil, fmt.Errorf("journal dir: %w", err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Poll <= 0 {
		c.Poll = 250 * time.Millisecond
	}
	reg := c.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	return &Processor{c: c, global: make(chan struct{}, c.MaxConcurrency), models: newModelSlots(c.MaxModelConcurrency),
		m: newMetrics(reg, c.MaxConcurrency), running: map[string]bool{}}, nil
}

// Run processes jobs until ctx ends.
func (p *Processor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { p.sweep(ctx) })
	for range p.c.Jobs {
		wg.Go(func() {
			for ctx.Err() == nil {
				id, err := p.c.Store.Dequeue(ctx, time.Second)
				if err != nil {
					if ctx.Err() == nil {
						p.c.Logger.Warn("dequeue", "err", err)
						sleep(ctx, time.Second)
					}
					continue
				}
				if id != "" {
					p.runJob(ctx, id)
				}
			}
		})
	}
	wg.Wait()
	return ctx.Err()
}

// sweep re-queues active jobs no one runs (after a crash, or a lease that
// expired) and deletes expired files.
func (p *Processor) sweep(ctx context.Context) {
	every := max(p.c.LeaseTTL/2, 200*time.Millisecond)
	var lastFiles time.Time
	for {
		if err := p.requeue(ctx); err != nil && ctx.Err() == nil {
			p.c.Logger.Warn("requeue", "err", err)
		}
		// Expired files and leftover journals: a full listing, so less often.
		if time.Since(lastFiles) >= fileSweepEvery {
			lastFiles = time.Now()
			if err := p.expireFiles(ctx); err != nil && ctx.Err() == nil {
				p.c.Logger.Warn("expire files", "err", err)
			}
			if err := p.removeStaleJournals(ctx); err != nil && ctx.Err() == nil {
				p.c.Logger.Warn("stale journals", "err", err)
			}
		}
		if !sleep(ctx, every) {
			return
		}
	}
}

// fileSweepEvery is how often expired files and stale journals are looked for.
const fileSweepEvery = time.Minute

// removeStaleJournals deletes the journals of batches that have ended (a
// crash between the final status and the journal's removal leaves one).
func (p *Processor) removeStaleJournals(ctx context.Context) error {
	entries, err := os.ReadDir(p.c.JournalDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), journalSuffix)
		if !ok {
			continue
		}
		b, err := p.c.Store.GetBatch(ctx, id)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if errors.Is(err, ErrNotFound) || final(b.Status) {
			if err := os.Remove(filepath.Join(p.c.JournalDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

func (p *Processor) requeue(ctx context.Context) error {
	ids, err := p.c.Store.Active(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		p.mu.Lock()
		mine := p.running[id]
		p.mu.Unlock()
		if mine {
			continue
		}
		b, err := p.c.Store.GetBatch(ctx, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return err
		}
		if err := p.c.Store.Enqueue(ctx, id, time.Unix(deref(b.ExpiresAt), 0)); err != nil {
			return err
		}
	}
	return nil
}

func (p *Processor) expireFiles(ctx context.Context) error {
	files, err := p.c.Store.ListFiles(ctx)
	if err != nil {
		return err
	}
	now := time.Now().Unix()
	for _, f := range files {
		if f.ExpiresAt != nil && *f.ExpiresAt <= now {
			if err := p.c.Store.DeleteFile(ctx, f.ID); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			if err := p.c.Blobs.Remove(f.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// runJob processes one batch while it holds the batch's lease.
func (p *Processor) runJob(ctx context.Context, id string) {
	// A batch can be in the queue twice (created, then re-queued by the
	// sweep before a worker took it); the lease is this owner's either way,
	// so only the running set keeps two of this process's workers from
	// running it at once (both dispatching every line).
	p.mu.Lock()
	if p.running[id] {
		p.mu.Unlock()
		return
	}
	p.running[id] = true
	p.mu.Unlock()
	ok, err := p.c.Store.Lease(ctx, id, p.c.Owner, p.c.LeaseTTL)
	if err != nil || !ok {
		p.mu.Lock()
		delete(p.running, id)
		p.mu.Unlock()
		return // another processor has it (or the store is down: the sweep retries)
	}
	jobCtx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.keepLease(jobCtx, cancel, id) })
	defer func() {
		cancel(nil)
		wg.Wait()
		// A fresh context: the lease should go even when ctx is done.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = p.c.Store.Unlease(rctx, id, p.c.Owner)
		rcancel()
		p.mu.Lock()
		delete(p.running, id)
		p.mu.Unlock()
	}()
	if err := p.process(jobCtx, id); err != nil && jobCtx.Err() == nil {
		p.c.Logger.Error("batch", "id", id, "err", err)
	}
}

var errLeaseLost = errors.New("lease lost")

const journalSuffix = ".journal"

func (p *Processor) keepLease(ctx context.Context, cancel context.CancelCauseFunc, id string) {
	for sleep(ctx, p.c.LeaseTTL/3) {
		ok, err := p.c.Store.Lease(ctx, id, p.c.Owner, p.c.LeaseTTL)
		if ctx.Err() != nil {
			return
		}
		if err != nil || !ok {
			p.c.Logger.Warn("batch lease lost; stopping", "id", id, "err", err)
			cancel(errLeaseLost)
			return
		}
	}
}

// modelSlots are the per-model concurrency limits, shared by all jobs: a
// model's semaphore exists while a job sends to it.
type modelSlots struct {
	mu    sync.Mutex
	limit int
	m     map[string]*modelSlot
}

type modelSlot struct {
	ch    chan struct{}
	users int
}

func newModelSlots(limit int) *modelSlots {
	return &modelSlots{limit: limit, m: map[string]*modelSlot{}}
}

func (s *modelSlots) acquire(model string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.m[model]
	if sl == nil {
		sl = &modelSlot{ch: make(chan struct{}, s.limit)}
		s.m[model] = sl
	}
	sl.users++
	return sl.ch
}

func (s *modelSlots) release(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.m[model]; sl != nil {
		if sl.users--; sl.users == 0 {
			delete(s.m, model)
		}
	}
}

// job is one batch being processed.
type job struct {
	p     *Processor
	b     BatchRecord
	tasks []task
	input *os.File
	j     *journal
	done  []atomic.Bool // by task index
	// counts and usage of the journal's records
	mu                sync.Mutex
	completed, failed int64
	usage             Usage
	changed           bool
}

func (p *Processor) process(ctx context.Context, id string) error {
	b, err := p.c.Store.GetBatch(ctx, id)
	if err != nil {
		return err
	}
	if final(b.Status) {
		return nil
	}
	input, err := p.c.Blobs.Open(b.InputFileID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err // the sweep tries again
	}
	if err != nil {
		return p.fail(ctx, id, BatchError{Code: "invalid_file", Message: fmt.Sprintf("The input file %s cannot be read: %v", b.InputFileID, err), Param: strp("input_file_id")})
	}
	defer input.Close()
	tasks, verrs, err := parseInput(input, b.Endpoint, p.c.MaxLines)
	if err != nil {
		return err
	}
	if len(verrs) > 0 {
		return p.fail(ctx, id, verrs...)
	}
	jb := &job{p: p, b: b, tasks: tasks, input: input, done: make([]atomic.Bool, len(tasks))}
	byLine := make(map[int]int, len(tasks))
	for i, t := range tasks {
		byLine[t.line] = i
	}
	jpath := filepath.Join(p.c.JournalDir, id+journalSuffix)
	jb.j, err = openJournal(jpath, func(r record) {
		if i, ok := byLine[r.Line]; ok {
			jb.done[i].Store(true)
			jb.count(r)
		}
	})
	if err != nil {
		return err
	}
	defer jb.j.close()
	if b.Status == StatusValidating {
		b, err = p.c.Store.UpdateBatch(ctx, id, func(r *BatchRecord) error {
			if r.Status == StatusValidating {
				r.Status, r.InProgressAt = StatusInProgress, now()
			}
			r.RequestCounts.Total = int64(len(tasks))
			r.Model = batchModel(tasks)
			return nil
		})
		if err != nil {
			return err
		}
		jb.b = b
	}
	outcome, err := jb.run(ctx)
	if err != nil || outcome == "" {
		return err
	}
	if err := jb.finish(ctx, outcome); err != nil {
		return err
	}
	// Once the status is final the file sweep may remove the journal
	// first (removeStaleJournals): either way it is gone.
	if err := os.Remove(jpath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// batchModel is the batch object's model: the one model all lines use.
func batchModel(tasks []task) *string {
	if len(tasks) == 0 {
		return nil
	}
	m := tasks[0].model
	for _, t := range tasks[1:] {
		if t.model != m {
			return nil
		}
	}
	return &m
}

func (p *Processor) fail(ctx context.Context, id string, errs ...BatchError) error {
	_, err := p.c.Store.UpdateBatch(ctx, id, func(r *BatchRecord) error {
		if final(r.Status) {
			return nil
		}
		r.Status, r.FailedAt = StatusFailed, now()
		r.Errors = &BatchErrors{Object: "list", Data: errs}
		return nil
	})
	if err == nil {
		p.m.jobs.WithLabelValues(StatusFailed).Inc()
	}
	return err
}

func (jb *job) count(r record) {
	jb.mu.Lock()
	defer jb.mu.Unlock()
	if r.Failed {
		jb.failed++
	} else {
		jb.completed++
	}
	if r.Usage != nil {
		jb.usage.add(*r.Usage)
	}
	jb.changed = true
}

// run dispatches the lines without a result and returns how the batch
// ends: completed, cancelled or expired, or "" when ctx ended first (the
// job stays active for the next processor).
func (jb *job) run(ctx context.Context) (string, error) {
	c := jb.p.c
	deadline := time.Unix(deref(jb.b.ExpiresAt), 0)
	switch {
	case jb.b.Status == StatusCancelling:
		return StatusCancelled, nil
	case jb.b.Status == StatusFinalizing:
		return StatusCompleted, nil
	case !time.Now().Before(deadline):
		return StatusExpired, nil
	}
	runCtx, cancelRun := context.WithDeadline(ctx, deadline)
	defer cancelRun()
	stop := make(chan struct{})
	var stopOnce sync.Once
	cancelled := false
	var wg sync.WaitGroup
	watchDone := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-watchDone:
				return
			case <-runCtx.Done():
				return
			case <-time.After(c.Poll):
			}
			if !cancelled {
				b, err := c.Store.GetBatch(runCtx, jb.b.ID)
				if err == nil && b.Status == StatusCancelling {
					cancelled = true
					stopOnce.Do(func() { close(stop) })
				}
			}
			jb.saveProgress(runCtx)
		}
	})
	groups := map[string][]int{}
	var order []string
	for i, t := range jb.tasks {
		if jb.done[i].Load() {
			continue
		}
		if _, ok := groups[t.model]; !ok {
			order = append(order, t.model)
		}
		groups[t.model] = append(groups[t.model], i)
	}
	var workers sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for _, m := range order {
		idx := groups[m]
		next := atomic.Int64{}
		slot := jb.p.models.acquire(m)
		defer jb.p.models.release(m)
		for range min(c.MaxModelConcurrency, len(idx)) {
			workers.Go(func() {
				for {
					k := int(next.Add(1) - 1)
					if k >= len(idx) || runCtx.Err() != nil || isClosed(stop) {
						return
					}
					if err := jb.runTask(runCtx, stop, slot, idx[k]); err != nil {
						firstErr.CompareAndSwap(nil, &err)
						stopOnce.Do(func() { close(stop) })
						return
					}
				}
			})
		}
	}
	workers.Wait()
	close(watchDone)
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return "", *e
	}
	switch {
	case ctx.Err() != nil: // shutdown or lease lost: someone resumes it
		return "", nil
	case cancelled:
		return StatusCancelled, nil
	case runCtx.Err() != nil:
		return StatusExpired, nil
	}
	for i := range jb.done {
		if !jb.done[i].Load() {
			return "", fmt.Errorf("line %d has no result", jb.tasks[i].line)
		}
	}
	return StatusCompleted, nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (jb *job) saveProgress(ctx context.Context) {
	jb.mu.Lock()
	if !jb.changed {
		jb.mu.Unlock()
		return
	}
	jb.changed = false
	completed, failed, usage := jb.completed, jb.failed, jb.usage
	jb.mu.Unlock()
	_, err := jb.p.c.Store.UpdateBatch(ctx, jb.b.ID, func(r *BatchRecord) error {
		r.RequestCounts.Completed, r.RequestCounts.Failed, r.Usage = completed, failed, usage
		return nil
	})
	if err != nil && ctx.Err() == nil {
		jb.p.c.Logger.Warn("save progress", "id", jb.b.ID, "err", err)
	}
}

// lineID is a line's id in the output: stable across retries and restarts.
func lineID(batchID, customID string) string {
	h := sha256.Sum256([]byte(batchID + "\x00" + customID))
	return "batch_req_" + hex.EncodeToString(h[:12])
}

// runTask runs task i until it has a result (journalled) or the run stops;
// an error is the journal's.
func (jb *job) runTask(ctx context.Context, stop, slot chan struct{}, i int) error {
	c := jb.p.c
	t := jb.tasks[i]
	body, err := readTask(jb.input, t)
	if err != nil {
		return err
	}
	id := lineID(jb.b.ID, t.customID)
	req := &Request{BatchID: jb.b.ID, CustomID: t.customID, Tenant: jb.b.Tenant, RequestID: id,
		Model: t.model, Method: "POST", URL: jb.b.Endpoint, Body: body}
	for attempt := 1; ; attempt++ {
		// The model's slot first, then the global one: one order, no deadlock.
		select {
		case slot <- struct{}{}:
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		}
		select {
		case jb.p.global <- struct{}{}:
		case <-ctx.Done():
			<-slot
			return nil
		case <-stop:
			<-slot
			return nil
		}
		model := jb.p.m.model(t.model)
		jb.p.m.inflight.Inc()
		jb.p.m.modelInflight.WithLabelValues(model).Inc()
		start := time.Now()
		resp, err := c.Dispatcher.Do(ctx, req)
		jb.p.m.modelDuration.WithLabelValues(model).Observe(time.Since(start).Seconds())
		jb.p.m.modelInflight.WithLabelValues(model).Dec()
		jb.p.m.inflight.Dec()
		<-jb.p.global
		<-slot
		if ctx.Err() != nil {
			return nil
		}
		last := attempt >= c.MaxAttempts
		var rec record
		switch {
		case err != nil && !last:
			c.Logger.Debug("line attempt failed", "batch", jb.b.ID, "custom_id", t.customID, "err", err)
		case err != nil:
			rec = errorRecord(t, id, CodeFailed, fmt.Sprintf("The request got no answer after %d attempts: %v", attempt, err))
		case retryable(resp.StatusCode) && !last:
		default:
			rec = responseRecord(t, id, resp)
		}
		if rec.Line == 0 {
			jb.p.m.retries.Inc()
			ra := ""
			if resp != nil {
				ra = resp.Header.Get("Retry-After")
			}
			select {
			case <-time.After(backoff(attempt, c.RetryBase, c.RetryMax, ra, rand.Int64N)):
				continue
			case <-ctx.Done():
				return nil
			case <-stop:
				return nil
			}
		}
		if err := jb.j.append(rec); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		jb.done[i].Store(true)
		jb.count(rec)
		if rec.Failed {
			jb.p.m.modelErrors.WithLabelValues(model).Inc()
		}
		return nil
	}
}

// marshalLine encodes an output line. Its parts are strings and a body
// already checked to be JSON, so encoding cannot fail; if it did, the line
// says so rather than vanish.
func marshalLine(l outputLine) json.RawMessage {
	raw, err := json.Marshal(l)
	if err != nil {
		raw, _ = json.Marshal(outputLine{ID: l.ID, CustomID: l.CustomID, Error: &lineError{Code: CodeFailed, Message: "unencodable result: " + err.Error()}})
	}
	return raw
}

func errorRecord(t task, id, code, msg string) record {
	return record{Line: t.line, Failed: true,
		Out: marshalLine(outputLine{ID: id, CustomID: t.customID, Error: &lineError{Code: code, Message: msg}})}
}

func responseRecord(t task, id string, resp *Response) record {
	body := json.RawMessage(resp.Body)
	if !json.Valid(body) {
		body, _ = json.Marshal(string(resp.Body))
	}
	reqID := resp.Header.Get(eppwire.HeaderRequestID)
	if reqID == "" {
		reqID = id
	}
	ok := resp.StatusCode >= 200 && resp.StatusCode < 300
	rec := record{Line: t.line, Failed: !ok,
		Out: marshalLine(outputLine{ID: id, CustomID: t.customID, Response: &lineResponse{StatusCode: resp.StatusCode, RequestID: reqID, Body: body}})}
	if ok {
		rec.Usage = parseUsage(resp.Body)
	}
	return rec
}

// parseUsage reads a response's token usage in the Chat Completions /
// Completions / Embeddings shape or the Responses shape.
func parseUsage(body []byte) *Usage {
	var r struct {
		Usage *struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			CompletionTokens    int64 `json:"completion_tokens"`
			InputTokens         int64 `json:"input_tokens"`
			OutputTokens        int64 `json:"output_tokens"`
			TotalTokens         int64 `json:"total_tokens"`
			PromptTokensDetails struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			InputTokensDetails struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"input_tokens_details"`
			CompletionTokensDetails struct {
				ReasoningTokens int64 `json:"reasoning_tokens"`
			} `json:"completion_tokens_details"`
			OutputTokensDetails struct {
				ReasoningTokens int64 `json:"reasoning_tokens"`
			} `json:"output_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil {
		return nil
	}
	u := r.Usage
	var out Usage
	out.InputTokens = u.PromptTokens + u.InputTokens
	out.OutputTokens = u.CompletionTokens + u.OutputTokens
	out.InputTokensDetails.CachedTokens = u.PromptTokensDetails.CachedTokens + u.InputTokensDetails.CachedTokens
	out.OutputTokensDetails.ReasoningTokens = u.CompletionTokensDetails.ReasoningTokens + u.OutputTokensDetails.ReasoningTokens
	out.TotalTokens = u.TotalTokens
	if out.TotalTokens == 0 {
		out.TotalTokens = out.InputTokens + out.OutputTokens
	}
	return &out
}

// outputFileID and errorFileID are a batch's result files: derived from
// its id, so that a finalisation repeated after a crash rewrites the same
// files.
func resultFileID(batchID, kind string) string {
	h := sha256.Sum256([]byte(batchID + "\x00" + kind))
	return "file-" + hex.EncodeToString(h[:12])
}

// finish gives every line without a result its error (the batch was
// cancelled or expired), writes the output and error files from the
// journal and sets the final status.
func (jb *job) finish(ctx context.Context, outcome string) error {
	c := jb.p.c
	code, msg := CodeExpired, "This request could not be executed before the completion window expired."
	if outcome == StatusCancelled {
		code, msg = CodeCancelled, "This request was not executed because the batch was cancelled."
	}
	for i, t := range jb.tasks {
		if jb.done[i].Load() {
			continue
		}
		rec := errorRecord(t, lineID(jb.b.ID, t.customID), code, msg)
		if err := jb.j.append(rec); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		jb.done[i].Store(true)
		jb.count(rec)
	}
	if outcome == StatusCompleted {
		b, err := c.Store.UpdateBatch(ctx, jb.b.ID, func(r *BatchRecord) error {
			if r.Status == StatusInProgress {
				r.Status, r.FinalizingAt = StatusFinalizing, now()
			}
			return nil
		})
		if err != nil {
			return err
		}
		if b.Status == StatusCancelling {
			outcome = StatusCancelled
		}
	}
	outID, errID := resultFileID(jb.b.ID, "output"), resultFileID(jb.b.ID, "error")
	outFile, err := c.Blobs.create(outID)
	if err != nil {
		return err
	}
	defer outFile.abort()
	errFile, err := c.Blobs.create(errID)
	if err != nil {
		return err
	}
	defer errFile.abort()
	var (
		counts RequestCounts
		usage  Usage
		werr   error
	)
	if _, err := jb.j.f.Seek(0, 0); err != nil {
		return err
	}
	_, err = scanJournal(jb.j.f, func(r record) {
		w := outFile
		if r.Failed {
			w, counts.Failed = errFile, counts.Failed+1
		} else {
			counts.Completed++
		}
		if r.Usage != nil {
			usage.add(*r.Usage)
		}
		if werr == nil {
			_, werr = w.Write(append(r.Out, '\n'))
		}
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	counts.Total = int64(len(jb.tasks))
	if counts.Completed+counts.Failed != counts.Total {
		return fmt.Errorf("journal has %d results for %d lines", counts.Completed+counts.Failed, counts.Total)
	}
	created := time.Now().Unix()
	var fileIDs [2]*string
	for i, f := range []*atomicFile{outFile, errFile} {
		if f.n == 0 {
			continue
		}
		id := []string{outID, errID}[i]
		if err := f.commit(); err != nil {
			return err
		}
		rec := FileRecord{Tenant: jb.b.Tenant, File: File{ID: id, Object: "file", Bytes: f.n, CreatedAt: created,
			Filename: jb.b.ID + []string{"_output.jsonl", "_error.jsonl"}[i], Purpose: PurposeBatchOutput, Status: "processed"}}
		if s := jb.b.OutputExpiresAfter; s > 0 {
			rec.ExpiresAt = ptr(created + s)
		}
		if err := c.Store.PutFile(ctx, rec); err != nil {
			return err
		}
		fileIDs[i] = &id
	}
	_, err = c.Store.UpdateBatch(ctx, jb.b.ID, func(r *BatchRecord) error {
		at := now()
		switch outcome {
		case StatusCompleted:
			r.CompletedAt = at
		case StatusCancelled:
			r.CancelledAt = at
		case StatusExpired:
			r.ExpiredAt = at
		}
		r.Status, r.OutputFileID, r.ErrorFileID, r.RequestCounts, r.Usage = outcome, fileIDs[0], fileIDs[1], counts, usage
		return nil
	})
	if err == nil {
		jb.p.m.jobs.WithLabelValues(outcome).Inc()
	}
	return err
}

func now() *int64 { return ptr(time.Now().Unix()) }

func ptr[T any](v T) *T { return &v }

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
