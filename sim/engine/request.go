package engine

import (
	"time"

	"github.com/kvgate/kvgate/internal/kvhash"
)

// Request is what a client asks the engine to run.
type Request struct {
	// ID names the request in outputs; unique among live requests.
	ID string
	// Prompt is the prompt's token ids.
	Prompt []int
	// MaxTokens is how many tokens to generate (the model never stops
	// early: there is no EOS in a simulation).
	MaxTokens int
	// LoRA names the adapter, "" for the base model.
	LoRA string
	// CacheSalt isolates this request's prefix-cache entries.
	CacheSalt string
	// PrefillOnly is P/D's prefill leg (kv_transfer_params.do_remote_decode):
	// the request stops after its first token and keeps its KV blocks for
	// the decoder to pull until Release or HeldBlockTimeout.
	PrefillOnly bool
	// RemotePrefill is P/D's decode leg (do_remote_prefill); nil otherwise.
	RemotePrefill *RemotePrefill
	// Priority is vLLM's request priority (the OpenAI body's "priority"):
	// under SchedulingPriority a lower value is scheduled first and
	// preempted last; ignored under SchedulingFCFS.
	Priority int
	// MM are the prompt's multimodal items, which enter its block hashes
	// as vLLM's extra keys.
	MM []kvhash.MMItem
}

// RemotePrefill says how much of a prompt a prefiller has computed.
type RemotePrefill struct {
	// Tokens is the number of leading prompt tokens whose KV the prefiller
	// holds. The engine pulls those it lacks locally and computes the rest
	// (at least the last prompt token, to sample from).
	Tokens int
	// Bandwidth (bytes/s) and Latency, when Bandwidth is positive, time
	// this pull instead of the engine's KVTransferBandwidth and
	// KVTransferLatency: the path from this request's prefiller.
	Bandwidth float64
	Latency   time.Duration
}

// TokenOutput is one generated token.
type TokenOutput struct {
	ID    string
	Token int
	// Index is the token's position in the output, 0 for the first.
	Index int
}

// FinishLength is the only finish reason: max_tokens or the context
// length was reached.
const FinishLength = "length"

// Usage counts a finished request's tokens as the OpenAI API reports them.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens were not computed for this request: local prefix-cache
	// hits plus KV pulled from a prefiller.
	CachedTokens int
}

// TransferParams is what a prefill-only request hands to its decoder
// (vLLM's kv_transfer_params.remote_block_ids).
type TransferParams struct {
	BlockIDs []int
}

// Finished reports a request that will produce no more tokens.
type Finished struct {
	ID          string
	Reason      string
	Usage       Usage
	Preemptions int
	// Scheduled is when the request first left the waiting queue (engine
	// clock): vLLM's queued time ends and its prefill begins there.
	Scheduled time.Time
	// Transfer is set for prefill-only requests, whose blocks stay held.
	Transfer *TransferParams
}

// StepResult is what one Step did. Its slices are reused by the next Step:
// copy what must outlive it.
type StepResult struct {
	// Duration is the modelled time of the step; the caller advances its
	// clock by it before acting on the outputs. Zero means nothing ran.
	Duration  time.Duration
	Shape     Shape
	Tokens    []TokenOutput
	Finished  []Finished
	Preempted []string
	// Scheduled is what the step computed for each request: the breakdown
	// behind Shape, in scheduling order.
	Scheduled []ScheduledSeq
	// Events are the step's KV-cache events, the batch also handed to
	// Config.Events. A caller that times publication itself (as Runner
	// does) leaves Config.Events nil and publishes these when its clock
	// reaches the end of the step, which is when vLLM publishes them.
	Events []Event
}

// ScheduledSeq is one request's part of a step.
type ScheduledSeq struct {
	ID string
	// Tokens are the tokens computed for it; Context those already in
	// its KV cache before the step (read by its attention).
	Tokens, Context int
	// Decode reports a one-token step of a request that has output: a
	// decode rather than a prefill (or recompute) chunk.
	Decode bool
	// Sampled reports that the step ends in a token for it (the last
	// chunk of a prefill, or a decode).
	Sampled bool
}

// Add accumulates one request's part into the step shape it belongs to,
// as the engine prices a step: what-if shapes of part of a batch are
// built from these.
func (q ScheduledSeq) Add(sh *Shape) {
	if q.Decode {
		sh.DecodeSeqs++
	} else {
		sh.PrefillTokens += q.Tokens
	}
	if q.Sampled {
		sh.SampledSeqs++
	}
	n, c := float64(q.Tokens), float64(q.Context)
	sh.ContextTokens += q.Context + q.Tokens
	sh.AttentionPairs += n*c + n*(n+1)/2
}

// Idle reports a step that scheduled nothing: the caller should wait for
// Add or for NextWake.
func (r *StepResult) Idle() bool { return r.Duration == 0 }

type seqState uint8

const (
	stateWaiting seqState = iota
	stateRemote           // waiting for remotely prefilled KV to arrive
	stateRunning
	stateHeld // prefill-only, finished, blocks held for the decoder
)

// seq is the engine's state of one request.
type seq struct {
	req       Request
	extra     kvhash.Extra
	tokens    []int // prompt then output
	numPrompt int
	out       int
	state     seqState

	computed     int     // tokens whose KV is in blocks
	blocks       []int32 // block table
	hashes       []kvhash.Hash
	cachedBlocks int // leading blocks registered in the prefix cache
	numCached    int // prompt tokens not computed; -1 until first scheduled

	remotePending int       // tokens computed once the transfer lands
	remoteDone    bool      // the one remote pull has been started
	ready         time.Time // transfer completion
	deadline      time.Time // held-block expiry

	rng         uint64
	preemptions int
	// arrival orders requests of equal priority: Add's sequence number.
	arrival uint64
	// scheduledAt is when the request first left the waiting queue.
	scheduledAt time.Time
}

// nextToken draws a deterministic pseudo-random token id (splitmix64), so
// that equal inputs give equal outputs and decode blocks hash like real
// text would: uniquely per request.
func (s *seq) nextToken(vocab int) int {
	s.rng += 0x9e3779b97f4a7c15
	z := s.rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int(z % uint64(vocab))
}

// seedOf derives a request's token stream from its id (FNV-1a).
func seedOf(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h = (h ^ uint64(id[i])) * 1099511628211
	}
	return h
}
