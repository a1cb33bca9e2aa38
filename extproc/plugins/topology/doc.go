// Package topology holds llm-d's topology-aware P/D plugins.
// topology-extractor gives each endpoint its locality from pod labels:
// hostname (kubernetes.io/hostname), rack (topology.kubernetes.io/rack),
// zone (topology.kubernetes.io/zone) and region
// (topology.kubernetes.io/region), each label key configurable.
// topology-affinity-filter and topology-affinity-scorer run in the
// prefill (or encode) profile of disagg-profile-handler and place that
// stage near the decode pick (disagg.PeerKey); with stageOrder
// prefill-first they run in the decode profile, near the prefill pick.
// The tightest level two endpoints share is host, rack, zone or region, a
// level matching only on equal non-empty values (an empty value matches
// nothing, not even another empty one). The filter keeps the candidates
// sharing at least minAffinity with that pick, and keeps them all when
// none does or the pick's locality is unknown (affinity never makes a
// request unroutable); the scorer gives 1 for the same host, 0.2 the same
// rack, 0.05 the same zone, 0.02 the same region and 0 otherwise, llm-d's
// curve after KV-transfer bandwidth (NVLink, one switch hop, several,
// inter-datacenter).
//
// llm-d's fallback of the hostname to a pod's spec.hostname is not
// carried: kvgate's endpoints hold the pod's labels only.
//
// The parameters are documented on Extractor, Filter and Scorer.
package topology
