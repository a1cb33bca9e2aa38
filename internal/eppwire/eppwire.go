package eppwire

import (
	"slices"
	"strings"
)

// Request headers the picker reads or sets.
const (
	// HeaderDestination is the picker's choice: a comma list of ip:port,
	// tried in order. Only the picker may set it; a proxy drops the
	// client's.
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderRequestID identifies a request across proxy, picker and server.
	HeaderRequestID = "x-request-id"
	// HeaderFairnessID, HeaderObjective (an InferenceObjective's name) and
	// HeaderModelRewrite are llm-d's names; the GIE names beside them
	// (…Deprecated) are still read, and the llm-d name wins when a request
	// carries both, as in llm-d.
	HeaderFairnessID             = "x-llm-d-inference-fairness-id"
	HeaderObjective              = "x-llm-d-inference-objective"
	HeaderModelRewrite           = "x-llm-d-model-name-rewrite"
	HeaderFairnessIDDeprecated   = "x-gateway-inference-fairness-id"
	HeaderObjectiveDeprecated    = "x-gateway-inference-objective"
	HeaderModelRewriteDeprecated = "x-gateway-model-name-rewrite"
	// HeaderPrefiller is llm-d's ip:port of the server that runs a P/D
	// request's prefill leg, read by the decoder's routing sidecar. Like
	// HeaderDestination, only the picker may set it.
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderEncoders is llm-d's comma list of ip:port of the encode servers
	// an E/P/D request's multimodal items go to; HeaderKVCacheSource the
	// ip:port of a peer holding more of the prompt's KV cache than the
	// server computing it, to pull from (llm-d's p2p-source-producer). Only
	// the picker may set them.
	HeaderEncoders      = "x-encoder-hosts-ports"
	HeaderKVCacheSource = "x-kv-cache-source-host-port"
)

// PickerOnly reports whether only the picker may set the request header
// name (lower case): a client's copy is removed before anything reads it,
// and whenever the picker sets none. A client that sent one would choose
// its upstream, or where its prompt's prefill, encode or KV pull goes (the
// P/D routing sidecar trusts them).
func PickerOnly(name string) bool { return slices.Contains(pickerOnly, name) }

var pickerOnly = []string{HeaderDestination, HeaderPrefiller, HeaderEncoders, HeaderKVCacheSource,
	HeaderPrefillerLLMD, HeaderEncodersLLMD, HeaderKVCacheSourceLLMD, HeaderDataParallel}

// PickerOnlyHeaders lists the headers PickerOnly accepts, for proxies that
// remove them.
func PickerOnlyHeaders() []string { return slices.Clone(pickerOnly) }

// HeaderPrefer is RFC 7240's Prefer request header. PreferIfAvailable is
// the preference llm-d's coordinator sends for a speculative decode: the
// picker answers 412 Precondition Failed unless the chosen decode server
// already caches part of the prompt.
const (
	HeaderPrefer      = "prefer"
	PreferIfAvailable = "if-available"
)

// PrefersIfAvailable reports whether a Prefer header value holds the
// if-available preference: a comma list of tokens, each with optional
// ";" parameters, matched without regard to case or surrounding space.
func PrefersIfAvailable(value string) bool {
	for pref := range strings.SplitSeq(value, ",") {
		token, _, _ := strings.Cut(pref, ";")
		if strings.EqualFold(strings.TrimSpace(token), PreferIfAvailable) {
			return true
		}
	}
	return false
}

// Request headers carrying a request's latency objectives, in milliseconds
// (llm-d's SLO-aware routing), and the older names llm-d still accepts; the
// current name wins when both are sent.
const (
	HeaderSLOTTFT           = "x-llm-d-slo-ttft-ms"
	HeaderSLOTPOT           = "x-llm-d-slo-tpot-ms"
	HeaderSLOTTFTDeprecated = "x-slo-ttft-ms"
	HeaderSLOTPOTDeprecated = "x-slo-tpot-ms"
)

// HeaderDroppedReason is llm-d's response header saying why the picker
// refused a request; its values are the Dropped… constants.
const HeaderDroppedReason = "x-llm-d-request-dropped-reason"

// llm-d's values of HeaderDroppedReason: rejected-… for a request that never
// reached a model server, evicted-… for one killed after dispatch.
const (
	DroppedSaturated        = "rejected-saturated"
	DroppedNoEndpoints      = "rejected-no-endpoints"
	DroppedTTLExpired       = "rejected-ttl-expired"
	DroppedContextCancelled = "rejected-context-cancelled"
	DroppedShuttingDown     = "rejected-shutting-down"
	DroppedEvicted          = "evicted"
	DroppedEvictedPressure  = "evicted-queue-pressure"
	DroppedEvictedPriority  = "evicted-priority"
)

// HeaderSessionToken is the header of llm-d's session-affinity-scorer:
// the base64 namespace/name of the endpoint that served a session, set on
// the response and echoed by the client.
const HeaderSessionToken = "x-session-token"

// Dynamic metadata. The picker sends its choice under MetadataLB too (key
// HeaderDestination), and the proxy reports the endpoint that answered under
// MetadataLB / MetadataServedKey; a subset hint arrives under
// MetadataSubsetHint / MetadataSubsetKey.
const (
	MetadataLB         = "envoy.lb"
	MetadataSubsetHint = "envoy.lb.subset_hint"
	MetadataSubsetKey  = "x-gateway-destination-endpoint-subset"
	MetadataServedKey  = "x-gateway-destination-endpoint-served"
)

// Video properties a client may send for multimodal requests (llm-d's
// token-producer estimate backend reads them): the source frame rate, the
// length in seconds and the frame resolution as WIDTHxHEIGHT.
const (
	HeaderVideoFPS        = "x-llm-d-video-fps"
	HeaderVideoDuration   = "x-llm-d-video-duration-seconds"
	HeaderVideoResolution = "x-llm-d-video-resolution"
)
