package demo

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/demo/report"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// agentTelemetry reads one report from the node agent at addr.
func agentTelemetry(ctx context.Context, policy, addr string) report.Telemetry {
	out := report.Telemetry{Policy: policy}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		out.Err = err.Error()
		return out
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err := telemetryv1.NewTelemetryClient(conn).Watch(ctx, &telemetryv1.WatchRequest{})
	if err != nil {
		out.Err = err.Error()
		return out
	}
	r, err := w.Recv()
	if err != nil {
		out.Err = err.Error()
		return out
	}
	out.Node, out.GPUAvailable, out.Reason = r.Node, r.GpuAvailable, r.GpuUnavailableReason
	for _, g := range r.Gpus {
		row := report.GPU{Index: int(g.Index), Name: g.Name, UtilizationPercent: g.UtilizationPercent,
			MemoryUsedGiB: float64(g.MemoryUsedBytes) / (1 << 30), MemoryTotal: float64(g.MemoryTotalBytes) / (1 << 30),
			PowerWatts: float64(g.PowerMilliwatts) / 1000, PowerLimit: float64(g.PowerLimitMilliwatts) / 1000,
			TemperatureCelsius: g.TemperatureCelsius, XIDErrors: g.XidErrors, LastXID: g.LastXid, Endpoints: g.Endpoints}
		for _, t := range telemetryv1.ThrottleReasonNames {
			if g.ThrottleReasons&t.Bit != 0 {
				row.Throttle = append(row.Throttle, t.Name)
			}
		}
		out.GPUs = append(out.GPUs, row)
	}
	for _, p := range r.Peers {
		out.Peers = append(out.Peers, report.Peer{Address: p.Address, Class: p.Class, Flows: p.Flows,
			SRTTMs: float64(p.SrttUs) / 1000, MinRTTMs: float64(p.MinRttUs) / 1000, Retransmits: p.Retransmits,
			MBytes: float64(p.BytesAcked) / 1e6, MBytesPerSec: p.ThroughputBytesPerSec / 1e6})
	}
	return out
}
