package eppwire

// llm-d renamed its disaggregation headers x-llm-d-…; its picker writes
// both spellings with one value and its routing sidecar trusts the older
// one first, because every picker strips a client's copy of that one while
// a picker older than the rename forwards a client's x-llm-d-… value
// untouched. kvgate's sidecar reads both in that order.
const (
	HeaderPrefillerLLMD     = "x-llm-d-prefiller-host-port"
	HeaderEncodersLLMD      = "x-llm-d-encoder-hosts-ports"
	HeaderKVCacheSourceLLMD = "x-llm-d-kv-cache-source-host-port"
)

// HeaderDataParallel is llm-d's ip:port of the data-parallel rank a
// request is for, set by data-parallel-profile-handler, which sends the
// request itself to the pod's primary port: the routing sidecar there
// forwards it to the rank. Only the picker may set it.
const HeaderDataParallel = "x-data-parallel-host-port"
