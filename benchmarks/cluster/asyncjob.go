package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/endpoints"
)

// AsyncJob is a batch job that shares the fleet with the run's other
// traffic, released into it by the async processor's own gate logic
// (async.Poll, the gates of async.Factory) on the virtual clock: every
// PollInterval the gate's budget lets floor(BatchSize × budget) messages
// go, each admitted message arrives at the picker as a new request, and a
// request the picker or an engine refuses (a 429 or 503 in production) is
// retried with the processor's backoff until its deadline.
type AsyncJob struct {
	// Requests are the job's requests; their Arrival is ignored (the gate
	// decides when each arrives). Objective names their class (sheddable).
	Requests []workload.Request
	// Start is when the job is enqueued; Deadline each message's deadline
	// after Start.
	Start, Deadline time.Duration
	PollInterval    time.Duration
	BatchSize       int
	// Gate is the queue's gate (llm-d-async's gate_type/gate_params);
	// picker-saturation reads the simulated picker's saturation detector.
	Gate async.GateConfig
}

// JobResult is what the job did. Its requests' own results are in
// Result.Requests, after the other traffic's.
type JobResult struct {
	Requests, Completed, Failed, Expired int
	Retries                              int
	// End is when the job's last request finished, from the job's start.
	End time.Duration
	// Polls counts poll rounds; ClosedPolls those whose budget let none go
	// while messages waited.
	Polls, ClosedPolls int
}

// simJob drives an AsyncJob inside the simulation.
type simJob struct {
	s     *sim
	cfg   AsyncJob
	gate  async.Gate
	first int // index of the job's first request in s.reqs
	// queue holds waiting request indexes from head on (a refused message
	// goes back in front).
	queue []int
	head  int
	// retries are due re-entries, earliest first.
	retries  []jobRetry
	releases map[int]func()
	byResult map[*RequestResult]int
	attempts map[int]int
	next     time.Time
	deadline time.Time
	rnd      *rand.Rand
	backoff  async.Backoff
	res      JobResult
}

type jobRetry struct {
	at time.Time
	i  int
}

// newSimJob appends the job's requests to the simulation's.
func newSimJob(s *sim, j AsyncJob, pool *endpoints.Datastore, saturation func([]*endpoints.Endpoint) float64) (*simJob, error) {
	if j.PollInterval <= 0 || j.BatchSize < 1 || j.Deadline <= 0 || j.Start < 0 {
		return nil, errors.New("async job: poll interval, batch size and deadline must be positive")
	}
	f := &async.Factory{PoolSaturation: func(context.Context) (float64, error) { return saturation(pool.Candidates()), nil }}
	g, err := f.New(j.Gate)
	if err != nil {
		return nil, fmt.Errorf("async job gate: %w", err)
	}
	js := &simJob{s: s, cfg: j, gate: g, first: len(s.reqs), releases: map[int]func(){}, byResult: map[*RequestResult]int{},
		attempts: map[int]int{}, next: s.start.Add(j.Start), deadline: s.start.Add(j.Start + j.Deadline),
		rnd: rand.New(rand.NewPCG(s.opts.Seed, 0xa5c)), res: JobResult{Requests: len(j.Requests)}}
	s.reqs = append(slices.Clip(s.reqs), j.Requests...)
	s.res.Requests = append(s.res.Requests, make([]RequestResult, len(j.Requests))...)
	for k := range j.Requests {
		i := js.first + k
		js.queue = append(js.queue, i)
		js.byResult[&s.res.Requests[i]] = i
		// Until it is dispatched, a request's result says so.
		s.res.Requests[i] = RequestResult{Replica: -1, Objective: j.Requests[k].Objective, Priority: s.opts.Objectives[j.Requests[k].Objective]}
	}
	return js, nil
}

// waiting reports messages in the queue or the retry set.
func (j *simJob) waiting() bool { return j != nil && (j.head < len(j.queue) || len(j.retries) > 0) }

// nextEvent is the next poll while messages wait. progress is false when
// the gate would let none go and no retry waits: polls alone cannot finish
// the simulation then.
func (j *simJob) nextEvent() (t time.Time, progress, ok bool) {
	if !j.waiting() {
		return time.Time{}, false, false
	}
	progress = len(j.retries) > 0 || math.Floor(float64(j.cfg.BatchSize)*j.gate.Budget(context.Background())) >= 1
	return j.next, progress, true
}

// poll runs the processor's poll round when one is due.
func (j *simJob) poll(ctx context.Context, now time.Time) {
	if j == nil || now.Before(j.next) {
		return
	}
	for !j.next.After(now) {
		j.next = j.next.Add(j.cfg.PollInterval)
	}
	// The retry mover: due retries re-enter the queue.
	for len(j.retries) > 0 && !j.retries[0].at.After(now) {
		j.queue = append(j.queue, j.retries[0].i)
		j.retries = j.retries[1:]
	}
	if j.head == len(j.queue) {
		return
	}
	r, err := async.Poll(ctx, now, j.gate, j.cfg.BatchSize, jobQueue{j, now})
	if err != nil {
		j.s.opts.Logger.Warn("async job poll", "err", err)
	}
	j.res.Polls++
	if r.Take == 0 {
		j.res.ClosedPolls++
	}
}

// jobQueue is the job's queue as async.Poll sees it.
type jobQueue struct {
	j   *simJob
	now time.Time
}

func (q jobQueue) Pop(context.Context) (*async.Envelope, error) {
	j := q.j
	if j.head == len(j.queue) {
		return nil, nil
	}
	i := j.queue[j.head]
	j.head++
	if j.head == len(j.queue) {
		j.queue, j.head = j.queue[:0], 0
	}
	return &async.Envelope{Request: async.Request{ID: strconv.Itoa(i), Deadline: j.deadline.Unix()}}, nil
}

func (q jobQueue) index(m *async.Envelope) int { i, _ := strconv.Atoi(m.Request.ID); return i }

func (q jobQueue) Requeue(_ context.Context, m *async.Envelope) error {
	j := q.j
	if j.head > 0 {
		j.head--
		j.queue[j.head] = q.index(m)
	} else {
		j.queue = append([]int{q.index(m)}, j.queue...)
	}
	return nil
}

func (q jobQueue) Expire(_ context.Context, m *async.Envelope) {
	j := q.j
	i := q.index(m)
	j.res.Expired++
	rr := &j.s.res.Requests[i]
	rr.Err = "async: deadline passed before dispatch"
	j.s.done++
}

func (q jobQueue) Dispatch(ctx context.Context, m *async.Envelope, release func()) error {
	j, i := q.j, q.index(m)
	j.releases[i] = release
	j.attempts[i]++
	rr := &j.s.res.Requests[i]
	*rr = RequestResult{}
	j.s.reqs[i].Arrival = q.now.Sub(j.s.start)
	j.s.arrive(ctx, i, q.now)
	return nil
}

// owns is the job's index of a result, or -1.
func (j *simJob) owns(rr *RequestResult) int {
	if j == nil {
		return -1
	}
	if i, ok := j.byResult[rr]; ok {
		return i
	}
	return -1
}

// finished records a job request's success.
func (j *simJob) finished(i int, now time.Time) {
	if j == nil || i < j.first {
		return
	}
	j.release(i)
	j.res.Completed++
	j.res.End = max(j.res.End, now.Sub(j.s.start.Add(j.cfg.Start)))
}

func (j *simJob) release(i int) {
	if rel := j.releases[i]; rel != nil {
		delete(j.releases, i)
		rel()
	}
}

// failed takes a refused job request: retried (true: it is not done) when
// the refusal is a retryable one and the deadline leaves room, else final.
func (j *simJob) failed(i int, rr *RequestResult, now time.Time) bool {
	j.release(i)
	// Every refusal in the simulation is one of capacity (flow control's
	// and the picker's 429s, an engine's full queue as a 503): retried.
	{
		if d, ok := j.backoff.Delay(j.attempts[i], j.deadline.Sub(now), 0, j.rnd.Float64); ok {
			j.res.Retries++
			at := now.Add(d)
			k, _ := slices.BinarySearchFunc(j.retries, at, func(r jobRetry, t time.Time) int { return r.at.Compare(t) })
			j.retries = slices.Insert(j.retries, k, jobRetry{at, i})
			return true
		}
		j.res.Expired++
	}
	j.res.End = max(j.res.End, now.Sub(j.s.start.Add(j.cfg.Start)))
	return false
}
