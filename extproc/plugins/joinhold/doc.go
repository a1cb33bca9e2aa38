// Package joinhold is kvgate's prefill-join-hold: it holds a routed request
// with a long uncached prompt in the picker while a request it sent to the
// same endpoint is still in prefill (has not streamed its first token), and
// lets it go when none is.
//
// # Why
//
// vLLM's scheduler gives the token budget a step leaves over to the next
// waiting prompt, FCFS. When a step computes the last chunk of one prompt
// (say 300 tokens: a memory-bound step of some 10 ms) and a long prompt is
// waiting, the long prompt's first chunk fills the rest of the budget and
// the step becomes a compute-bound one of 8,192 tokens, some 400 ms: the
// short prompt's first token comes 40 times later than its own work
// needs. The long prompt gains little from the early start, since prefill
// compute is nearly linear in tokens: what it saves is one step's fixed
// cost. Under bursts this join is the dominant error of any decision-time
// TTFT prediction (the later request that joins is routed after the
// earlier one's prediction was made) and a large part of the short
// prompts' TTFT. Holding the long prompt until the earlier prompts' first
// tokens keeps those steps short and the predictions true, at the price of
// the long prompt sitting out one step (the one its release overlaps).
//
// Only prompts of at least minTokens uncached tokens are held; shorter
// ones join freely (their chunk adds little to a step) and are never held
// behind a held one — so a long prompt also waits for the short ones that
// went past it while it waited, which its first chunk would otherwise
// join. Held long prompts go one at a time, in routing order. A held
// request waits at most maxHold; a client that goes away releases its
// place. Requests whose first token the picker
// cannot see (non-streaming responses, where the first chunk is the whole
// answer) and P/D requests (the decode server does not prefill) are
// neither held nor waited for.
//
// # What it costs
//
// A held prompt costs its server the step it sits out and the batching of
// prompts that would have shared a step. minTokens keeps that small next
// to the prompt's own compute; it must stay above the size most of a
// workload's prompts have: at 256 the turns of a chat (a cached history
// and a few hundred new tokens) are held one by one, and p90 TTFT went
// from 0.06 to 1.6 s in the bench. Overloaded with prompts all just above
// it, the hold serves them closer to first come, first served: p99 and
// throughput improve and the median rises (benchmarks/RESULTS.md).
//
// The predicted-latency-producer, given this plugin's name in its
// prefillJoinHold parameter, predicts with the hold: a held prompt starts
// the step after the one that begins when no prompt is in prefill there.
//
// Parameters:
//
//	minTokens: int      the uncached prompt tokens from which a request
//	                    is held (default 512)
//	maxHold: duration   the longest a request is held (default 10s): a
//	                    bound for a stream that stalls; holding costs the
//	                    request nothing while the prompts ahead progress,
//	                    since it could not start before them
//
// # Ownership
//
// A Plugin's lines (per endpoint, the streaming requests routed there that
// have not had a first token, in routing order) are guarded by its mutex;
// each line holds at most maxLine requests (beyond that a request is not
// tracked, and is neither held nor waited for). An endpoint's line goes
// with its last request, and with the endpoint (EndpointsRemoved); lines
// are recycled, so that a decision allocates nothing. A ticket belongs to
// its request until the cycle state is released (scheduling.Recycler).
package joinhold
