package telemetry

import (
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// Interval bounds of a Watch stream.
const (
	MinInterval     = 100 * time.Millisecond
	MaxInterval     = time.Minute
	DefaultInterval = time.Second
	// MaxReportPeers bounds the peers one report carries (the freshest).
	MaxReportPeers = 1024
)

// Config configures a Server.
type Config struct {
	// Node names this agent's node; required.
	Node string
	// Addresses are the node's IPs, by which the picker resolves peers and
	// endpoint hosts to this node.
	Addresses []netip.Addr
	// GPUs is nil on an agent started without GPU telemetry.
	GPUs  GPUSource
	Peers []PeerSource
	Now   func() time.Time
	Log   *slog.Logger
}

// Server implements telemetryv1.TelemetryServer.
type Server struct {
	telemetryv1.UnimplementedTelemetryServer
	cfg Config

	stopped  chan struct{}
	stopOnce sync.Once
}

// NewServer checks cfg and returns a server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "telemetry: a node name is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Server{cfg: cfg, stopped: make(chan struct{})}, nil
}

// Stop ends every Watch stream, now and later. A watch lasts as long as its
// watcher, so a graceful stop of the gRPC server, which waits for every
// call to end, must end them first.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stopped) }) }

// Watch sends a report now and then one per interval until the watcher
// leaves or the server stops.
func (s *Server) Watch(req *telemetryv1.WatchRequest, stream telemetryv1.Telemetry_WatchServer) error {
	iv := DefaultInterval
	if req.IntervalMs > 0 {
		iv = min(max(time.Duration(req.IntervalMs)*time.Millisecond, MinInterval), MaxInterval)
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		if err := stream.Send(s.Report()); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-s.stopped:
			return status.Error(codes.Unavailable, "telemetry: agent stopping")
		case <-t.C:
		}
	}
}

// Report builds one report from the sources.
func (s *Server) Report() *telemetryv1.Report {
	r := &telemetryv1.Report{Node: s.cfg.Node, UnixNano: s.cfg.Now().UnixNano()}
	for _, a := range s.cfg.Addresses {
		r.Addresses = append(r.Addresses, a.String())
	}
	if s.cfg.GPUs == nil {
		r.GpuUnavailableReason = "GPU telemetry is off (--gpu=off)"
	} else {
		r.GpuAvailable, r.GpuUnavailableReason = s.cfg.GPUs.Available()
		for _, g := range s.cfg.GPUs.GPUs() {
			r.Gpus = append(r.Gpus, gpuProto(g))
		}
	}
	var peers []PeerStats
	for _, src := range s.cfg.Peers {
		peers = append(peers, src.Peers()...)
	}
	if len(peers) > MaxReportPeers {
		// The freshest are the ones worth routing on.
		slices.SortFunc(peers, func(a, b PeerStats) int { return b.Updated.Compare(a.Updated) })
		peers = peers[:MaxReportPeers]
	}
	for _, p := range peers {
		r.Peers = append(r.Peers, &telemetryv1.Peer{
			Address: p.Peer.String(), Class: p.Class, Flows: uint32(max(p.Flows, 0)),
			SrttUs: uint64(max(p.SRTT.Microseconds(), 0)), MinRttUs: uint64(max(p.MinRTT.Microseconds(), 0)),
			Retransmits: p.Retransmits, BytesAcked: p.BytesAcked, ThroughputBytesPerSec: p.ThroughputBytesPerSec,
			UpdatedUnixNano: unixNano(p.Updated),
		})
	}
	return r
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func gpuProto(g GPU) *telemetryv1.GPU {
	return &telemetryv1.GPU{
		Index: uint32(max(g.Index, 0)), Uuid: g.UUID, Name: g.Name,
		UtilizationPercent: g.UtilizationPercent, MemoryUtilizationPercent: g.MemoryUtilizationPercent,
		MemoryUsedBytes: g.MemoryUsedBytes, MemoryTotalBytes: g.MemoryTotalBytes,
		PowerMilliwatts: g.PowerMilliwatts, PowerLimitMilliwatts: g.PowerLimitMilliwatts,
		TemperatureCelsius: g.TemperatureCelsius, SmClockMhz: g.SMClockMHz, MemoryClockMhz: g.MemClockMHz,
		ThrottleReasons: g.ThrottleReasons, XidErrors: g.XIDErrors, LastXid: g.LastXID,
		LastXidUnixNano: unixNano(g.LastXIDTime), EccCorrected: g.ECCCorrected, EccUncorrected: g.ECCUncorrected,
		NvlinkTxBytes: g.NVLinkTxBytes, NvlinkRxBytes: g.NVLinkRxBytes,
		Endpoints: g.Endpoints, PodUids: g.PodUIDs,
	}
}
