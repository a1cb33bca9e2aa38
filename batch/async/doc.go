// Package async is kvgate's async processor (`kvgate async`), a
// re-implementation of llm-d-async's redis-sortedset transport: it drains
// inference requests from Redis sorted sets into the slack of the online
// fleet.
//
// Producers ZADD messages scored by their deadline (Unix seconds) in
// llm-d-async's envelope format; every poll interval each queue's gate
// gives a budget in [0, 1], the processor pops floor(batch_size × budget)
// messages earliest-deadline first (dropping those already past their
// deadline), passes each through the gate and hands the admitted ones to a
// worker that POSTs them to the gateway with the queue's
// InferenceObjective. Results (any HTTP answer, or an error code) are
// LPUSHed to the result list; a 429 or 5xx goes to the retry sorted set
// scored by when it is due (exponential backoff with jitter, Retry-After
// honoured, never past the deadline) and a mover returns due retries to
// their queue. Metrics carry llm-d-async's names (llm_d_async_async_*).
//
// Gates: constant, local-max-concurrency, composite, prometheus-saturation,
// prometheus-budget, prometheus-query (through a Prometheus server) and
// picker-saturation, which reads the picker's own pool saturation (its
// flow-control saturation gauge, scraped from its /metrics). Poll is the
// gate logic by itself, over any Queue: the cluster benchmark runs a batch
// job through it on its virtual clock.
//
// Client is the producer side: Submit, Cancel, and Do, which enqueues one
// request and waits for its result (what kvgate batch dispatches through).
//
// Delivery: a pop moves the message into the queue's processing set
// (ProcessingKey) in one step, and every later move (its result, a retry, a
// refusal) leaves that set in the same MULTI. A processor killed at any
// moment leaves what it held in the processing set, and after
// --redelivery-timeout any processor puts it back in its queue: each
// message gets exactly one result, though a request cut off by the kill is
// sent again. (llm-d-async pops with a bare ZPOPMIN, which loses them.)
// Bounds: the worker count, batch_size per poll, one message of
// MaxMessageBytes, result bodies of 64 MiB.
package async
