// Package classload is the class-load-scorer, kvgate's own (llm-d and GIE
// have no plugin that places by traffic class): it scores endpoints by the
// requests of each traffic class the picker has in flight there, so that
// placement can tell sheddable work from protected work.
//
// A request is sheddable when its priority is negative (llm-d's meaning),
// protected otherwise. The plugin counts, per endpoint, the requests of
// each class routed there (its PreRequest, on the primary target) whose
// responses have not finished (its ResponseComplete): the picker's own
// account, current at every decision, where a scrape is tens of
// milliseconds old and knows no classes.
//
// A request is scored by
//
//	load(e) = sameClassWeight × in-flight requests of its class on e
//	        + otherClassWeight × in-flight requests of the other class on e
//
// inverse min-max normalised over the candidates (the least loaded scores
// 1). The weights choose the placement:
//
//   - spread (1, 0, the default): each class is balanced across the servers
//     on its own. With apply: sheddable this evens out the batch sequences
//     every server runs, which is what online latency pays for (each one
//     lengthens every engine step the online requests share with it), while
//     online requests keep the default profile's prefix affinity. On the
//     mixed bench it lowered online p90 TTFT and raised batch throughput
//     under every admission and workload shape measured
//     (benchmarks/RESULTS.md, "Class-aware placement").
//   - separate (0, 1): protected requests go where the fewest sheddable ones
//     run and sheddable where the fewest protected ones do, so batch fills
//     some servers and online runs beside little of it. Measured worse on
//     the same bench: online loses the servers batch takes over (its own
//     density costs it as much as the batch it avoids) and the servers it
//     is steered off hold its conversations' prefix caches.
//   - (1, 1): total in-flight requests, as running-requests-scorer.
//
// Parameters:
//
//	apply: string             the requests it scores: "both" (default),
//	                          "sheddable" or "protected" (the others get
//	                          equal scores: no preference)
//	sameClassWeight: float    weight of the request's own class (1)
//	otherClassWeight: float   weight of the other class (0)
//
// presence-holdback-policy (extproc/plugins/flowpolicy) reads an instance's
// totals to hold batch admission back while online requests run.
//
// Both weights are in [0, 1] and not both 0. Every endpoint's account is
// dropped when it leaves the pool; a request still in flight there
// releases the account it was counted in.
package classload
