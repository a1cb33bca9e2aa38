// Package classload is the class-load-scorer, kvgate's own (llm-d and GIE
// have no plugin that places by traffic class): it scores endpoints by the
// requests of each traffic class the picker has in flight there, so that
// placement can tell sheddable work from protected work.
//
// A request is sheddable when its priority is negative (llm-d's meaning),
// protected otherwise. The counts are the datastore's live load split by
// class (endpoints.Endpoint.InflightByClass): every request the picker
// routed there whose response has not finished, charged at the decision,
// moved to the fallback when the proxy served one, released with the rest
// of the request's load; current at every decision, where a scrape is tens
// of milliseconds old and knows no classes. With P/D a request also counts
// on its prefill server until its first token, as the live load does.
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
// totals (the counts summed over the endpoints it has placed requests on)
// to hold batch admission back while online requests run.
//
// Both weights are in [0, 1] and not both 0. An endpoint leaves the totals
// when it leaves the pool.
package classload
