package dashboards

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/agent/gpu"
	"github.com/kvgate/kvgate/agent/gpu/gpumock"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// startGPUAgent serves the node agent's GPU metrics (agent/gpu's
// collector, as kvgate-agent registers it) over go-nvml's mock DGX H200,
// with one GPU that raised an XID error and one thermally throttled, so
// that the GPU dashboard's panels show the states it exists for. It
// returns the metrics address.
func startGPUAgent(t *testing.T) string {
	t.Helper()
	m, err := gpumock.New("dgxh200")
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Devices {
		m.Update(i, func(s *gpumock.State) {
			s.UtilizationPercent, s.PowerMilliwatts = uint32(40+5*i), uint32(300_000+20_000*i)
		})
	}
	m.Update(3, func(s *gpumock.State) {
		s.ThrottleReasons, s.TemperatureCelsius = telemetryv1.ThrottleHWThermalSlowdown, 91
		s.ECCCorrected = 4
	})
	c, err := gpu.New(gpu.Config{Lib: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	m.InjectXID(5, 79)
	reg := promclient.NewRegistry()
	reg.MustRegister(c)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	t.Cleanup(func() {
		hs.Close()
		cancel()
		wg.Wait()
		c.Close()
	})
	return ln.Addr().String()
}
