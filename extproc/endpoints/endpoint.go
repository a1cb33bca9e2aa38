package endpoints

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// Label keys with a meaning to the picker.
const (
	// RoleLabel is llm-d's pod label naming a server's disaggregation role:
	// prefill | decode | both | encode.
	RoleLabel = "llm-d.ai/role"
)

// Spec is an endpoint's identity: what discovery knows about it.
type Spec struct {
	// Name is unique within the pool (a pod name, or <pod>-rank-<i>).
	Name string `json:"name"`
	// Address is the ip:port the proxy connects to; metrics are scraped from
	// http://<Address>/metrics unless MetricsURL is set.
	Address string `json:"address"`
	// Labels are carried from the pod (or the static file) for filters.
	Labels map[string]string `json:"labels,omitempty"`
	// MetricsURL overrides the scrape URL.
	MetricsURL string `json:"metricsURL,omitempty"`
	// NodeAddress is the IP of the node the server runs on (the pod's
	// status.hostIP), where node-level exporters listen (dcgm-data-source
	// with useNodeAddress); empty when unknown.
	NodeAddress string `json:"nodeAddress,omitempty"`
	// KVEvents is a ZMQ endpoint (tcp://ip:port) the picker connects to for
	// this server's KV-cache events; empty when the server publishes to the
	// picker's central socket or not at all.
	KVEvents string `json:"kvEvents,omitempty"`
	// KVEventsReplay is the server's replay ROUTER endpoint
	// (--kv-events-replay-endpoint), used to refill missed events after a
	// sequence gap; empty when it has none.
	KVEventsReplay string `json:"kvEventsReplay,omitempty"`
	// Hostname lets Address be host:port with a DNS name for host (a peer
	// cluster's gateway, from multicluster-file-discovery), which whatever
	// routes on the picker's answer resolves; otherwise Address is a
	// literal ip:port.
	Hostname bool `json:"-"`
	// DataParallel places the endpoint among the data-parallel ranks of
	// a server that serves one per target port; nil for a server's only
	// endpoint. Discovery sets it for a pod with several target ports
	// (named <pod>-rank-<i>): the name alone cannot say, since a one-port
	// pod may be named x-rank-1. A pointer keeps Endpoint in its 256 bytes.
	DataParallel *DataParallelRank `json:"dataParallel,omitempty"`
}

// DataParallelRank is one data-parallel rank's place: its server (the
// pod) and the port's place in it.
type DataParallelRank struct {
	Server string `json:"server"`
	Rank   int    `json:"rank"`
}

// Metrics is one immutable snapshot of a model server's state as scraped.
type Metrics struct {
	WaitingQueueSize int
	RunningRequests  int
	// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
	KVCacheUsage float64
	// ActiveLoRAs and WaitingLoRAs are adapter names from
	// vllm:lora_requests_info; MaxLoRAs is how many may be resident at once.
	ActiveLoRAs  map[string]struct{}
	WaitingLoRAs map[string]struct{}
	MaxLoRAs     int
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info (0 when
	// the server does not export it).
	BlockSize    int
	NumGPUBlocks int
	// UpdateTime is when this snapshot was taken; the zero time means the
	// endpoint was never scraped successfully.
	UpdateTime time.Time
}

// Endpoint is one routable model-server rank. Its identity is immutable;
// metrics and the picker's own in-flight counters change concurrently and are
// read without locks.
//
// A decision reads every candidate, and at 256 candidates it is the number
// of distinct cache lines it touches that sets its cost when another process
// emptied the caches (benchmarks/RESULTS.md, BenchmarkColdPick). So what a
// decision reads of a candidate (the live load, the step clock, whether the
// snapshot lists adapters) comes first, in the first two cache lines, and
// the struct is padded to 256 bytes, a size class whose objects start on a
// cache line; the identity, read for the chosen endpoint only, follows.
// TestEndpointLayout pins this.
type Endpoint struct {
	endpointFields
	_ [endpointSize - unsafe.Sizeof(endpointFields{}) - unsafe.Sizeof(atomic.Pointer[rareState]{})]byte
	// rare is read by the deciders that price a prefill server's backlog
	// (PrefillBacklog) and at every charge change, not by every decision.
	// It comes after the padding: a zero-length array as a struct's last
	// field would be padded to the next word.
	rare atomic.Pointer[rareState]
}

// endpointSize is Endpoint's padded size. The padding is derived from the
// fields' size, so a new field shrinks it, and fields that outgrow
// endpointSize stop the build (a negative array length) instead of
// silently moving endpoints off their cache lines.
const endpointSize = 256

// endpointFields are Endpoint's fields, hot ones first.
type endpointFields struct {
	load  liveLoad
	steps stepClock
	// adapters is whether the metrics snapshot lists any LoRA adapter, so
	// that a request's adapter check skips the snapshots (and their adapter
	// maps) of servers that list none.
	adapters atomic.Bool
	metrics  atomic.Pointer[Metrics]

	inflightRequests atomic.Int64
	inflightTokens   atomic.Int64
	// remoteRequests and remoteTokens are the part of the in-flight counts
	// that are remote prefills (ChargeComputedBy), read by what prices
	// decoding, not by every decision.
	remoteRequests atomic.Int64
	remoteTokens   atomic.Int64

	spec Spec
}

// NewEndpoint returns an endpoint with an empty metrics snapshot.
func NewEndpoint(spec Spec) *Endpoint {
	e := &Endpoint{endpointFields: endpointFields{spec: spec}}
	e.metrics.Store(&Metrics{})
	return e
}

// ListsAdapters reports whether the latest snapshot lists a LoRA adapter,
// active or waiting, without reading the snapshot.
func (e *Endpoint) ListsAdapters() bool { return e.adapters.Load() }

// Spec returns the endpoint's identity. Callers must not modify Labels.
func (e *Endpoint) Spec() Spec { return e.spec }

// Name is shorthand for Spec().Name.
func (e *Endpoint) Name() string { return e.spec.Name }

// Address is shorthand for Spec().Address.
func (e *Endpoint) Address() string { return e.spec.Address }

// Label returns one label value.
func (e *Endpoint) Label(key string) string { return e.spec.Labels[key] }

// Metrics returns the latest snapshot; never nil. Callers must not modify it.
func (e *Endpoint) Metrics() *Metrics { return e.metrics.Load() }

// SetMetrics publishes a new snapshot and reconciles the live load with it.
// Only the endpoint's scraper calls it.
func (e *Endpoint) SetMetrics(m *Metrics) {
	e.load.reconcile(m)
	e.adapters.Store(len(m.ActiveLoRAs)+len(m.WaitingLoRAs) > 0)
	e.metrics.Store(m)
}

// MetricsAge is how old the snapshot is at now; a never-scraped endpoint is
// infinitely stale.
func (e *Endpoint) MetricsAge(now time.Time) time.Duration {
	t := e.metrics.Load().UpdateTime
	if t.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return now.Sub(t)
}

// InflightRequests is the number of requests the picker has routed here whose
// response has not finished.
func (e *Endpoint) InflightRequests() int64 { return e.inflightRequests.Load() }

// InflightTokens is the prompt+expected output tokens of those requests.
func (e *Endpoint) InflightTokens() int64 { return e.inflightTokens.Load() }

// DecodingInflight is InflightRequests and InflightTokens less the remote
// prefills charged here: the requests that decode, or will, on this
// server. A P/D prefill server's own decode batch is empty however many
// prompts it computes for others. The counts move separately, so a read
// racing a charge is clamped at 0.
func (e *Endpoint) DecodingInflight() (requests, tokens int64) {
	return max(0, e.inflightRequests.Load()-e.remoteRequests.Load()), max(0, e.inflightTokens.Load()-e.remoteTokens.Load())
}

// InflightByClass splits InflightRequests by traffic class. Both counts
// move together at every charge, move and release; a read racing one may
// see the sheddable count changed and the total not yet, so protected is
// clamped at 0.
func (e *Endpoint) InflightByClass() (protected, sheddable int64) {
	sheddable = e.load.sheddableRequests.Load()
	return max(0, e.inflightRequests.Load()-sheddable), sheddable
}
