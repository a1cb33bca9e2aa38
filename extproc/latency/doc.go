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
// The quantile comes from the residuals: each endpoint fits a log-normal to
// log(actual/predicted) (running mean and variance) and the quantile
// prediction is the mean prediction scaled by its q-th quantile.
//
// A new endpoint predicts with the pool's model (fitted on every sample)
// until it has seen enough samples of its own.
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
