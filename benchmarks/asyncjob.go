package benchmarks

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
)

// JobOptions are the --async-job flags: a batch job of Requests requests
// (objective "batch", sheddable) that the async processor's gate logic
// releases into the fleet beside the workload's own traffic.
type JobOptions struct {
	Requests     int
	Start        time.Duration
	Deadline     time.Duration
	PollInterval time.Duration
	BatchSize    int
	Gate         string
}

// DefaultJobGate is the job's default gate: at most 256 in flight, and
// none while the picker's pool saturation is at 0.5 or more.
const DefaultJobGate = `{"gate_type":"composite","gate_params":{"gates":[` +
	`{"gate_type":"local-max-concurrency","gate_params":{"limit":256}},` +
	`{"gate_type":"picker-saturation","gate_params":{"threshold":0.5}}]}}`

func defaultJobOptions() JobOptions {
	return JobOptions{Deadline: time.Hour, PollInterval: 100 * time.Millisecond, BatchSize: 32, Gate: DefaultJobGate}
}

func (j *JobOptions) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&j.Requests, "async-job", j.Requests, "a batch job of N requests (objective \"batch\", priority -1, --batch-prompt-tokens + --batch-output-tokens each) released by the async processor's gates (0: none)")
	fs.DurationVar(&j.Start, "async-job-start", j.Start, "async job: when it is enqueued")
	fs.DurationVar(&j.Deadline, "async-job-deadline", j.Deadline, "async job: each message's deadline after the start")
	fs.DurationVar(&j.PollInterval, "async-poll-interval", j.PollInterval, "async job: the processor's poll_interval")
	fs.IntVar(&j.BatchSize, "async-batch-size", j.BatchSize, "async job: the processor's batch_size (messages per poll at budget 1)")
	fs.StringVar(&j.Gate, "async-gate", j.Gate, "async job: the queue's gate, {\"gate_type\":...,\"gate_params\":{...}} as in llm-d-async (picker-saturation reads the simulated picker)")
}

// job is the cluster's AsyncJob, nil without --async-job; o.Batch*Tokens
// size its requests.
func (o Options) job() (*cluster.AsyncJob, error) {
	j := o.Job
	if j.Requests == 0 {
		return nil, nil
	}
	if j.Requests < 0 || j.Requests > 1_000_000 {
		return nil, fmt.Errorf("--async-job must be 0..1000000, got %d", j.Requests)
	}
	if o.BatchPromptTokens < 1 || o.BatchOutputTokens < 1 {
		return nil, errors.New("--async-job needs --batch-prompt-tokens and --batch-output-tokens ≥ 1")
	}
	var g async.GateConfig
	if err := json.Unmarshal([]byte(j.Gate), &g); err != nil {
		return nil, fmt.Errorf("--async-gate: %w", err)
	}
	reqs := make([]workload.Request, j.Requests)
	for i := range reqs {
		// Unique prompts: keys above every generator's.
		reqs[i] = workload.Request{Segments: []workload.Segment{{Key: 1<<62 + uint64(i), Len: o.BatchPromptTokens}},
			OutputTokens: o.BatchOutputTokens, Objective: workload.ObjectiveBatch}
	}
	return &cluster.AsyncJob{Requests: reqs, Start: j.Start, Deadline: j.Deadline, PollInterval: j.PollInterval, BatchSize: j.BatchSize, Gate: g}, nil
}

// JobSummary is what the async job got.
type JobSummary struct {
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Expired   int `json:"expired"`
	Retries   int `json:"retries"`
	// CompletionS is from the job's start to its last request's end.
	CompletionS float64 `json:"completion_s"`
	TTFTP90     float64 `json:"ttft_p90_s"`
	Polls       int     `json:"polls"`
	ClosedPolls int     `json:"closed_polls"`
}

func summarizeJob(res *cluster.Result) *JobSummary {
	j := res.Job
	if j == nil {
		return nil
	}
	s := &JobSummary{Requests: j.Requests, Completed: j.Completed, Failed: j.Failed, Expired: j.Expired, Retries: j.Retries,
		CompletionS: j.End.Seconds(), Polls: j.Polls, ClosedPolls: j.ClosedPolls}
	var ttft []float64
	for _, r := range res.Requests[len(res.Requests)-j.Requests:] {
		if r.Err == "" {
			ttft = append(ttft, r.TTFT.Seconds())
		}
	}
	slices.Sort(ttft)
	s.TTFTP90 = pct(ttft, 90)
	return s
}

// jobTable writes the async jobs of the runs that had one.
func jobTable(b *strings.Builder, r *Results) {
	head := false
	for _, s := range r.Policies {
		if s.Job == nil {
			continue
		}
		if !head {
			b.WriteString("\nAsync job (released by the async processor's gates):\n\n| policy | qps scale | requests | completed | failed | expired | retries | completion s | job TTFT p90 s | polls | closed polls |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
			head = true
		}
		j := s.Job
		fmt.Fprintf(b, "| %s | %g | %d | %d | %d | %d | %d | %.1f | %.3f | %d | %d |\n",
			s.Name, s.QPSScale, j.Requests, j.Completed, j.Failed, j.Expired, j.Retries, j.CompletionS, j.TTFTP90, j.Polls, j.ClosedPolls)
	}
}
