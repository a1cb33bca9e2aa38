package telemetry

import (
	"time"
)

// GPUHealth is the state of the GPUs one endpoint runs on (the worst of
// them where it spans several).
type GPUHealth struct {
	Node string
	GPUs int
	// XIDErrors is the sum over the GPUs since their agent started;
	// LastXID and LastXIDTime are the latest one's (zero when none).
	XIDErrors   uint64
	LastXID     uint64
	LastXIDTime time.Time
	// ThrottleReasons is the OR of the GPUs' NVML clocks event reasons
	// (telemetryv1.Throttle*).
	ThrottleReasons       uint64
	MaxTemperatureCelsius uint32
	MaxUtilizationPercent uint32
	ECCUncorrected        uint64
	// Updated is when the report these figures come from arrived.
	Updated time.Time
}

// GPUHealth returns the health of the GPUs endpoint ("host:port") runs
// on; ok is false when no fresh report names them.
func (s *Store) GPUHealth(endpoint string) (GPUHealth, bool) {
	now := s.cfg.Now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var h GPUHealth
	a := s.addrOf(endpoint)
	for _, k := range a.keys() {
		if k == "" {
			continue
		}
		for _, r := range s.endpoints[k] {
			n := s.freshLocked(r.node, now)
			if n == nil {
				continue
			}
			g := r.gpu
			h.Node = n.name
			if n.received.After(h.Updated) {
				h.Updated = n.received
			}
			h.GPUs++
			h.XIDErrors += g.XidErrors
			if g.LastXidUnixNano > 0 {
				if at := time.Unix(0, g.LastXidUnixNano); at.After(h.LastXIDTime) {
					h.LastXID, h.LastXIDTime = g.LastXid, at
				}
			}
			h.ThrottleReasons |= g.ThrottleReasons
			h.MaxTemperatureCelsius = max(h.MaxTemperatureCelsius, g.TemperatureCelsius)
			h.MaxUtilizationPercent = max(h.MaxUtilizationPercent, g.UtilizationPercent)
			h.ECCUncorrected += g.EccUncorrected
		}
		if h.GPUs > 0 {
			return h, true
		}
	}
	return h, false
}
