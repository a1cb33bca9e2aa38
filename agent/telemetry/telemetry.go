package telemetry

import (
	"net/netip"
	"time"
)

// PeerStats is the network to one peer address for one flow class: what
// the tracker (agent/netobs) measures of TCP flows and of NIXL READs.
type PeerStats struct {
	Peer  netip.Addr
	Class string
	Flows int
	// SRTT and MinRTT are the smoothed and smallest round-trip times (for
	// class kv_nixl: the READs' latency).
	SRTT, MinRTT          time.Duration
	Retransmits           uint64
	BytesAcked            uint64
	ThroughputBytesPerSec float64
	Updated               time.Time
}

// PeerSource reports per-peer network statistics; it must not block.
type PeerSource interface {
	Peers() []PeerStats
}

// GPU is one GPU's state as the agent reports it.
type GPU struct {
	Index                    int
	UUID, Name               string
	UtilizationPercent       uint32
	MemoryUtilizationPercent uint32
	MemoryUsedBytes          uint64
	MemoryTotalBytes         uint64
	PowerMilliwatts          uint32
	PowerLimitMilliwatts     uint32
	TemperatureCelsius       uint32
	SMClockMHz, MemClockMHz  uint32
	ThrottleReasons          uint64
	XIDErrors                uint64
	LastXID                  uint64
	LastXIDTime              time.Time
	ECCCorrected             uint64
	ECCUncorrected           uint64
	NVLinkTxBytes            uint64
	NVLinkRxBytes            uint64
	// Endpoints are the model servers on this GPU ("host:port", or a bare
	// IP for every port of that host); PodUIDs the Kubernetes pods of the
	// processes using it.
	Endpoints []string
	PodUIDs   []string
}

// GPUSource reports the node's GPUs; it must not block. Available is
// false, with the reason, when there is no NVML.
type GPUSource interface {
	GPUs() []GPU
	Available() (bool, string)
}
