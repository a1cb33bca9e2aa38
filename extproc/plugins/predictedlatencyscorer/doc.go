// Package predictedlatencyscorer is GIE v1.5's monolithic
// predicted-latency-scorer: one plugin that predicts every candidate's TTFT
// and TPOT, trains on what it observes, and picks one endpoint itself (that
// endpoint scores 1, every other 0). kvgate builds the prediction and the
// training from its own latency model: the plugin owns a
// predicted-latency-producer (extproc/plugins/predictedlatency) and uses the
// cautious (quantile) predictions it writes. The scorer is self-contained,
// as upstream's is; configure it instead of, not beside, a
// predicted-latency-producer.
//
// The pick, for a request whose SLOs come from x-slo-ttft-ms /
// x-slo-tpot-ms (or the x-llm-d-slo-* names), in milliseconds; a missing
// SLO is 0, so every candidate then misses it and the pick favours the
// fastest:
//
//  1. Headroom: TTFT headroom is the SLO minus the predicted TTFT; with
//     streamingMode, TPOT headroom is the TPOT SLO times sloBufferFactor —
//     lowered to the smallest TPOT SLO among the requests this scorer has
//     running on the endpoint (times the factor), when that is not 0 —
//     minus the predicted TPOT. Without streamingMode TPOT is ignored.
//  2. Global affinity gate: candidates holding at least affinityGateTauGlobal
//     of the prompt in their prefix cache are kept alone, unless (with
//     probability epsilonExploreSticky) the gate is skipped, or the best of
//     them is predicted more than affinityMaxTTFTPenaltyMs slower to first
//     token than the best of all.
//  3. Tiers: candidates with no negative headroom are positive, the rest
//     negative. With both tiers present the negative one is chosen with
//     probability epsilonExploreNeg.
//  4. Positive tier: the same gate with affinityGateTau, then a weighted
//     random pick, weights from the TTFT and TPOT headroom normalised
//     within the tier and blended by headroomTTFTWeight / headroomTPOTWeight:
//     "least" favours the least headroom (packing), "most" the most.
//  5. Negative tier: endpoints with no running request of this scorer are
//     strictly preferred; then the affinityGateTau gate; then weights from
//     the TTFT and TPOT deficits normalised within each violation class,
//     blended by negHeadroomTTFTWeight / negHeadroomTPOTWeight (smaller
//     deficit, higher weight).
//
// The composite strategies pick by a weighted random draw over free KV
// cache, short queue and prefix-cache hit instead of headroom
// ("composite-most" favours the highest composite, "composite-least" the
// lowest, "composite-only" skips the tiers), as does a request without
// predictions. selectionMode "max" takes the heaviest weight instead of
// drawing.
//
// As an admitter it refuses a sheddable request (negative priority) when
// it carries a TTFT SLO (and a TPOT SLO, in streaming mode), no candidate
// is predicted to meet it, every candidate has requests of this scorer
// running, none is cold (KV cache under 2% used) and none passes the
// global affinity gate.
//
// Parameters (GIE v1.5's):
//
//	samplingMean: float              TPOT sampling of GIE's sidecar; kvgate
//	                                 measures TPOT over the whole stream:
//	                                 only 1000 (the default) is accepted
//	maxSampledTokens: int            likewise, only 0
//	sloBufferFactor: float           scales the TPOT SLO (default 1)
//	negHeadroomTTFTWeight: float     default 0.8
//	negHeadroomTPOTWeight: float     default 0.2
//	headroomTTFTWeight: float        default 0.8
//	headroomTPOTWeight: float        default 0.2
//	headroomSelectionStrategy: string  least (default) | most |
//	                                 composite-least | composite-most |
//	                                 composite-only
//	compositeKVWeight: float         default 1
//	compositeQueueWeight: float      default 1
//	compositePrefixWeight: float     default 1
//	epsilonExploreSticky: float      default 0.01
//	epsilonExploreNeg: float         default 0.01
//	affinityGateTau: float           default 0.80 (0 disables)
//	affinityGateTauGlobal: float     default 0.99 (0 disables)
//	affinityMaxTTFTPenaltyMs: float  default 5000 (0 disables)
//	contextTTL: duration             nanoseconds as GIE's JSON writes a Go
//	                                 duration, or a string ("5m"); default 5m
//	selectionMode: string            linear (default) | max
//	streamingMode: bool              default true
//	endpointRoleLabel: string        default ""
package predictedlatencyscorer
