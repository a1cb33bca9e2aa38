package report

// Telemetry is what the fleet's node agent reported at the end of a run:
// its GPUs (NVML) and the network to its peers.
type Telemetry struct {
	Policy string
	Node   string
	// GPUAvailable is false where the agent runs without NVML; Reason says
	// why.
	GPUAvailable bool
	Reason       string
	GPUs         []GPU
	Peers        []Peer
	// Err is set when no report could be read.
	Err string
}

// GPU is one GPU's row.
type GPU struct {
	Index                      int
	Name                       string
	UtilizationPercent         uint32
	MemoryUsedGiB, MemoryTotal float64
	PowerWatts, PowerLimit     float64
	TemperatureCelsius         uint32
	Throttle                   []string
	XIDErrors, LastXID         uint64
	Endpoints                  []string
}

// Peer is one peer address's row.
type Peer struct {
	Address, Class       string
	Flows                uint32
	SRTTMs, MinRTTMs     float64
	Retransmits          uint64
	MBytes, MBytesPerSec float64
}
