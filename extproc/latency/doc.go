// Package latency is the picker's online latency model: for a request on a
// candidate endpoint it predicts time to first token (TTFT) and time per
// output token (TPOT), the mean and a high quantile, from the request's
// uncached prompt tokens on that endpoint and the endpoint's live load
// (extproc/endpoints: prefill backlog, decode batch). It learns each
// endpoint's speed from the TTFT and TPOT the picker observes on response
// streams, so a pool mixing accelerators needs no configuration.
//
// # Why a physically shaped model, fitted in process
//
// llm-d trains XGBoost quantile regressors in a Python sidecar and calls it
// over HTTP per decision. A continuous-batching server's latency has a known
// shape: TTFT is the prefill work ahead of the request (its own uncached
// tokens plus the backlog) at the server's prefill rate, slowed by the
// decode batch that shares every step, plus the rest of the decode step in
// progress when it arrives (the endpoint's step clock, read from the
// response chunks of its streams: for a short cached prompt that wait is
// most of its TTFT); TPOT is a step time that grows with the batch and its
// context. A linear model over exactly those terms, one per endpoint, has
// six (TTFT) or four (TPOT) coefficients, learns from tens of
// samples instead of thousands, extrapolates to loads it has not seen (a
// tree ensemble cannot), costs nanoseconds per candidate and no allocation,
// and needs no sidecar. The fit minimises relative (not absolute) squared
// error, which is what MAPE measures, by recursive least squares with a
// forgetting factor, so it follows a server whose speed changes.
//
// # The engine twin
//
// Where the picker routed everything a server holds, TTFT is predicted by
// a twin of the server's scheduler instead (twin.go): the queue of prompts
// routed there and not yet past their first token, scheduled forward with
// chunked prefill in a token budget, decodes first, and a roofline step
// cost whose coefficients are fitted from TTFTs the same way. It prices
// what a backlog total cannot: where in the step sequence the request
// lands (a short prompt behind a long one waits for the long one's last
// chunk, one arriving mid-step waits the step out). Traffic the picker did
// not route, or a queue beyond its bound, falls back to the features above.
// The queue's own schedule does not depend on the request appended to it
// until the step that admits it, so each twin keeps that trajectory
// (twincache.go, at most 128 steps) until its queue, clock, decode batch or
// step cost change: a candidate's projection is then a binary search and
// the request's own chunks, whatever the queue's length, and gives the
// same result as the full schedule. A decision predicts every candidate
// without recording the projection; Model.Sample recomputes the chosen
// one's, which the model learns from at the first token.
//
// # The delay a request imposes
//
// A request's first token ends the step that computes its last chunk, and
// that step's leftover budget goes, FCFS, to requests routed there after
// it: a burst-mate routed a moment later can fill the step and make it
// several times longer than projected, which no prediction made at the
// earlier decision can know. The later decision does know: its projection
// sees which queued prompts finish in the step its first chunk joins, and
// Estimate.Imposed is the time its chunk adds to each of their first
// tokens (summed). The latency scorer ranks by TTFT + Imposed, so a burst
// spreads over servers where joining costs the queued prompts more than
// it saves the newcomer, and the predictions already made stay true
// (bursty trace ×2, 1,500 requests: TTFT MAPE 26.8 % → 16.0 %).
//
// # Held prompts
//
// Imposed only steers the join; under a prefill-join-hold
// (extproc/plugins/joinhold, Config.HoldTokens) the picker prevents it for
// long prompts: one routed while a prompt it sent there is in prefill
// waits in the picker until none is, reaches the server after the step
// that begins then has begun, and so sits that step out. The twin
// schedules exactly that (twinEntry.waiting, .clear): a held entry is
// skipped while any entry the server has is in prefill — ahead of it, or
// a shorter one routed after it, which the hold lets go at once — and for
// the one step after; a first token of such a short prompt does not count
// the held entry as computed (FCFS holds among the prompts at the server,
// not in routing order). Since a held prompt's release waits for the new
// request's prefill too, the trajectory cache is not used while one is
// held. Bursty trace ×3 TTFT MAPE 19.3 % → 8.5 % (benchmarks/RESULTS.md).
//
// # Joiners expected
//
// Where short prompts arrive every step (chat ×32: a few turns per step
// on every server), the step that computes a prompt's last chunk also
// computes the turns that reached the server before it began, and a turn
// routed early in a step is joined more often than not. The projection
// adds the expected arrivals to that step (joiners.go): the endpoint's
// recent rate of joinable prompts (a held prompt never joins) times the
// wait until the step begins, less ln 2 arrivals (the median count, so a
// join less likely than not adds nothing), shaped like the recent ones,
// within the step's room. Its weight is learned for MAPE (0 where joins
// do not come, ≈ 1 on chat ×32). The sample's hindsight, which the step
// cost learns from, has the joiners that came instead. Chat ×32 TTFT
// MAPE 18.8 % → 15.6 % with the robust fit below; the rest is who joins:
// the joiners that really came, priced, give 6 %, while the best
// decision-time guess from the wait alone (a learned median per wait)
// stays near 15 % (benchmarks/RESULTS.md).
//
// # A full batch
//
// Past max_num_seqs running sequences a prompt waits for one to finish.
// The projection frees, after each step, one over the endpoint's mean
// output length (learned from completed responses) of its decoding
// sequences, and waiting prompts take the freed places in FCFS order
// (completions.go); before any completion is seen a full batch leaves the
// prediction to the feature model. Chat ×32 at seed 2 (overloaded): TTFT
// MAPE 27.6 % → 24.2 %, p99 6.80 → 4.82 s, the router now seeing the waits.
//
// # A fit robust to what the twin does not model
//
// The step cost learns from each first token at full weight only while
// the twin's schedule explains it to within 10 % (twinHuber); a sample it
// misses by more (a phase it had wrong, a release from a hold, work it
// was not told of) weighs as Huber's loss weighs it. Fitted at full
// weight, such samples moved the coefficients: on a mixed H100/H200 fleet
// one H200 ended a run pricing a 2,048-token prefill at 76 ms where it
// takes 57, and its tiny prompts' single memory-bound steps ran 30–50 %
// over (seed 3, ×2: TTFT MAPE 10.4 % → 7.4 %).
//
// Tried and dropped: learning, per endpoint, how likely a later request
// is to join (by the delay to the projected last step and the room it
// leaves; four outcome levels, each priced by the twin) and predicting the
// 1/y-weighted median of the outcomes (MAPE's optimum) or their mean.
// The median changed MAPE by −1.0 to +0.8 points, the mean made it worse
// (bursty ×2 38.2 %): the join is close to a coin toss at the decision
// (0.5–0.77 in every cell, by burst position too), and against an outcome
// two or more times longer the MAPE-optimal answer is the short one
// unless the join is near-certain. Even the in-sample best multiplier per
// cell only reaches 20.7 % on bursty ×2, while pricing the actual joiners
// gives 3.2 %: what is missing is knowing who joins, not the price.
// Also dropped: learning the step cost from step lengths (the gap between
// the step clock's last two step ends at a first token) beside the TTFTs.
// Most such steps took what their believed shape costs; the rest, two to
// thirty times more, held work the twin did not know was there, and
// fitting them raised every step's cost (benchmarks/RESULTS.md). That
// work was the twin's phase, since fixed (below); the samples were tried
// before the fix.
//
// # The twin's clock
//
// Between the real step ends it sees, the twin runs the schedule on its
// own clock with the fitted cost, so two rules keep its phase. A prompt
// routed while the server decodes waits for the decode step in progress:
// its first chunk goes into the step after, which begins at the end of
// that one — and since the twin next advances only at a later decision or
// first token, when the step clock has passed the arrival, the step end
// to start from is the one the decision saw (twin.idleEnd). And a real
// step end a little later than one the twin estimated is that step's
// end, not the end of the step after it (advance's rephase). Without
// them the twin believed a prompt's first chunk computed in the decode
// step it arrived during — found by dumping, on one simulated server, the
// engine's real step composition beside the twin's at every step: 488 of
// 642 prefill steps held a prompt whose progress the twin had wrong, by
// 3,100 tokens on average, nearly always ahead (18 after). That was the
// work the twin did not know was there in the steps that took 2–30×
// their projection (TestTwinPhaseAtArrivalMidStep; Poisson trace ×3 TTFT
// MAPE 15.9 % → 4.3 %, benchmarks/RESULTS.md).
//
// The quantile comes from the residuals: each endpoint fits a log-normal to
// log(actual/predicted) (running mean and variance) and the quantile
// prediction is the mean prediction scaled by its q-th quantile.
//
// TPOT is the feature model's: the decode batch and context a stream
// joins, and whether a prefill shares its steps. Tried and dropped
// (benchmarks/RESULTS.md, issue 12): the prompts routed to the endpoint
// during a stream's decode, which share its steps, as d / (1 − c·r) with
// r the endpoint's recent prefill rate and c learned from the prefill each
// ended stream shared. TPOT MAPE moved one to three points on the fleet
// and rose on one server: the rate is alike on every server the picker
// balances, and which later prompts join a decode is decided after it (the
// streams' TPOT is skewed: a short stream that shares one 8,000-token
// chunk takes several times its median). The quantile is calibrated (0.86
// to 0.91 of streams within the 0.9 quantile on the mixed fleet).
//
// A new endpoint predicts with the pool's model (fitted on every sample)
// until it has seen enough samples of its own. Before the pool has seen
// any, the twin predicts with its prior step cost (an 8B model's
// roofline) rather than the feature model with its prior (a line, some
// four times too slow for that model), as long as the twin knows all of
// the endpoint's live backlog: a bursty trace's first second arrives
// before any first token, and its requests made a third of the ×3 MAPE
// (bursty ×3 8.5 % → 6.6 %, mixed fleet ×3 11.9 % → 9.2 %).
//
// # Ownership
//
// A Model is safe for concurrent use: predictions read an endpoint's
// coefficients through an atomic pointer; observations of one endpoint
// serialise on its mutex. An endpoint's twin serialises on a mutex of its
// own (a prediction brings it to the latest step end); a routed request's
// Ticket belongs to the request. Endpoints are added on first observation and
// removed by Forget; at MaxEndpoints the least recently used fit makes
// room (a late response can bring back a forgotten endpoint's fit).
package latency
