// Package disagg holds llm-d's disaggregation profile handler and its
// deprecated forms: disagg-profile-handler, which runs the decode profile and,
// when their deciders approve, the encode and prefill profiles (EPD, P/D,
// E/PD, E/P/D), and names the chosen prefill and encode servers to the decode
// pod's routing sidecar in the headers x-prefiller-host-port and
// x-encoder-hosts-ports; pd-profile-handler, its deprecated P/D-only
// predecessor; and disagg-headers-handler / prefill-header-handler, the
// deprecated PreRequest plugins that used to set those headers (the handler
// sets them itself now; configurations listing both still work).
//
// # Stage order
//
// decode-first (the default): decode runs first; with its pick known, the
// encode decider and then the prefill decider are asked, and their profiles
// run when they approve. A decode profile that picks nothing ends the cycle
// (the request fails with the decode profile's error). prefill-first: the
// prefill profile runs whenever it is configured, with no decider (a
// prefill decider is a configuration error), then encode if its decider
// approves, then decode. Each later stage's profile reads the earlier pick
// (PeerKey: decode's in decode-first, prefill's in prefill-first) for
// topology affinity. Decode is always the primary profile: the request
// goes to the decode pod, whose sidecar runs the other legs.
//
// # Deciders
//
// A decider is any configured plugin with a Disaggregate method (the Decider
// interface): prefix-based-pd-decider, always-disagg-pd-decider,
// always-disagg-multimodal-decider and kvgate's transfer-cost-pd-decider. A
// stage whose decider is not configured never runs.
//
// The parameters are documented on Handler, PDHandler and HeadersHandler.
//
// # Metrics
//
// Each completed decision is counted as llm_d_epp_disagg_decision_total
// (pd-profile-handler: llm_d_epp_pd_decision_total) with decision_type
// decode-only, prefill-decode, encode-decode or encode-prefill-decode,
// through the Recorder registered as the handle service ServiceRecorder.
package disagg
