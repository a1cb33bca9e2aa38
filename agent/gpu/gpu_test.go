package gpu_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/agent/gpu"
	"github.com/kvgate/kvgate/agent/gpu/gpumock"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)) }

func open(t *testing.T, model string) (*gpumock.Server, *gpu.Collector) {
	t.Helper()
	m, err := gpumock.New(model)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gpu.New(gpu.Config{Lib: m, Log: quiet(), MinSamplePeriod: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return m, c
}

func TestMockServers(t *testing.T) {
	for _, tc := range []struct {
		model, name string
		memGiB      uint64
	}{
		{"dgxh100", "NVIDIA H100 80GB HBM3", 80},
		{"dgxh200", "NVIDIA H200 141GB HBM3e", 141},
		{"dgxa100", "Mock NVIDIA A100-SXM4-40GB", 40},
		{"dgxb200", "NVIDIA B200 180GB HBM3e", 180},
	} {
		t.Run(tc.model, func(t *testing.T) {
			m, c := open(t, tc.model)
			if ok, why := c.Available(); !ok {
				t.Fatalf("unavailable: %s", why)
			}
			m.Update(2, func(s *gpumock.State) {
				s.UtilizationPercent, s.PowerMilliwatts, s.TemperatureCelsius = 97, 650_000, 84
				s.ThrottleReasons = telemetryv1.ThrottleHWThermalSlowdown | telemetryv1.ThrottleSWPowerCap
				s.ECCCorrected, s.ECCUncorrected = 12, 1
				s.MemoryUsedBytes = 7 << 30
			})
			gs := c.GPUs()
			if len(gs) != 8 {
				t.Fatalf("%d GPUs, want 8", len(gs))
			}
			g := gs[2]
			if g.Index != 2 || !strings.HasPrefix(g.UUID, "GPU-") || g.Name != tc.name {
				t.Errorf("identity %d %q %q", g.Index, g.UUID, g.Name)
			}
			if g.MemoryTotalBytes != tc.memGiB<<30 || g.MemoryUsedBytes != 7<<30 {
				t.Errorf("memory %d/%d", g.MemoryUsedBytes, g.MemoryTotalBytes)
			}
			if g.UtilizationPercent != 97 || g.PowerMilliwatts != 650_000 || g.PowerLimitMilliwatts != 700_000 || g.TemperatureCelsius != 84 {
				t.Errorf("util %d power %d/%d temp %d", g.UtilizationPercent, g.PowerMilliwatts, g.PowerLimitMilliwatts, g.TemperatureCelsius)
			}
			if g.ThrottleReasons != 0x44 || g.ECCCorrected != 12 || g.ECCUncorrected != 1 || g.SMClockMHz == 0 {
				t.Errorf("throttle %#x ecc %d/%d sm %d", g.ThrottleReasons, g.ECCCorrected, g.ECCUncorrected, g.SMClockMHz)
			}
			if gs[0].UtilizationPercent != 10 {
				t.Errorf("GPU 0 changed with GPU 2: %+v", gs[0])
			}
			tx := g.NVLinkTxBytes
			time.Sleep(20 * time.Millisecond)
			if g2 := c.GPUs()[2]; g2.NVLinkTxBytes <= tx || g2.NVLinkRxBytes == 0 {
				t.Errorf("NVLink counters did not grow: %d -> %d", tx, g2.NVLinkTxBytes)
			}
		})
	}
}

func TestXIDEvents(t *testing.T) {
	m, c := open(t, "dgxh200")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	m.InjectXID(5, 79)
	m.InjectXID(5, 48)
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := c.GPUs()[5]
		if g.XIDErrors == 2 {
			if g.LastXID != 48 || g.LastXIDTime.IsZero() {
				t.Fatalf("last XID %d at %v", g.LastXID, g.LastXIDTime)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("XID errors %d, want 2", g.XIDErrors)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, g := range c.GPUs() {
		if i != 5 && g.XIDErrors != 0 {
			t.Errorf("GPU %d has %d XID errors", i, g.XIDErrors)
		}
	}
}

// TestWithoutNVML runs on the real library loader: this machine has no
// driver, so the collector must say so once and report nothing.
func TestWithoutNVML(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a GPU driver is present")
	}
	var log bytes.Buffer
	c, err := gpu.New(gpu.Config{Log: slog.New(slog.NewTextHandler(&log, nil))})
	if !errors.Is(err, gpu.ErrUnavailable) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
	if ok, why := c.Available(); ok || why == "" {
		t.Fatalf("Available() = %v, %q", ok, why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Run(ctx) // returns at once
	if gs := c.GPUs(); len(gs) != 0 {
		t.Fatalf("GPUs without NVML: %v", gs)
	}
	c.Close()
	if n := strings.Count(log.String(), "running without NVML"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, log.String())
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 1 {
		t.Fatalf("metrics without NVML: %d series, %v (want kvgate_gpu_nvml_available only)", n, err)
	}
}

func TestMetrics(t *testing.T) {
	m, c := open(t, "dgxh100")
	// A GPU that cannot read its power leaves the series out.
	m.Devices[1].(*server.Device).GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	m.Update(0, func(s *gpumock.State) { s.ThrottleReasons = telemetryv1.ThrottleSWThermalSlowdown })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for _, tc := range []struct {
		name string
		want int
	}{
		{"kvgate_gpu_nvml_available", 1},
		{"kvgate_gpu_utilization_percent", 8},
		{"kvgate_gpu_power_watts", 7},
		{"kvgate_gpu_clock_mhz", 16},
		{"kvgate_gpu_throttle_reason", 8 * len(telemetryv1.ThrottleReasonNames)},
		{"kvgate_gpu_xid_errors_total", 8},
		{"kvgate_gpu_ecc_errors_total", 16},
		{"kvgate_gpu_nvlink_bytes_total", 16},
	} {
		if n, err := testutil.GatherAndCount(reg, tc.name); err != nil || n != tc.want {
			t.Errorf("%s: %d series (%v), want %d", tc.name, n, err, tc.want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_gpu_throttle_reason" {
			continue
		}
		on := 0
		for _, s := range mf.Metric {
			if s.GetGauge().GetValue() == 1 {
				on++
				for _, l := range s.Label {
					if l.GetName() == "reason" && l.GetValue() != "sw_thermal_slowdown" {
						t.Errorf("throttled for %q", l.GetValue())
					}
				}
			}
		}
		if on != 1 {
			t.Errorf("%d throttle series on, want 1", on)
		}
	}
}

func TestPodMapping(t *testing.T) {
	root := t.TempDir()
	mk := func(pid, netns, cgroup, fib string) {
		dir := filepath.Join(root, pid)
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("net:["+netns+"]", filepath.Join(dir, "ns", "net")); err != nil {
			t.Fatal(err)
		}
		if cgroup != "" {
			os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644)
		}
		if fib != "" {
			os.MkdirAll(filepath.Join(dir, "net"), 0o755)
			os.WriteFile(filepath.Join(dir, "net", "fib_trie"), []byte(fib), 0o644)
		}
	}
	mk("self", "4026531840", "", "")
	// A pod on the systemd cgroup driver, in its own network namespace.
	mk("4242", "4026532999",
		"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-abc.scope\n",
		`Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.244.1.0/24 2 0 2
        |-- 10.244.1.0
           /24 link UNICAST
        |-- 10.244.1.17
           /32 host LOCAL
  +-- 127.0.0.0/8 2 0 2
     |-- 127.0.0.1
        /32 host LOCAL
Local:
  +-- 10.244.1.0/24 2 0 2
        |-- 10.244.1.17
           /32 host LOCAL
`)
	// A host-network process (same namespace): its UID only (cgroupfs).
	mk("77", "4026531840", "12:memory:/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/0123\n", "")
	m, err := gpumock.New("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	m.Update(0, func(s *gpumock.State) { s.PIDs = []uint32{4242, 77, 9999} })
	c, err := gpu.New(gpu.Config{Lib: m, Log: quiet(), ProcRoot: root, Endpoints: map[int][]string{0: {"10.0.0.5:8000"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.GPUs()[0]
	if want := []string{"0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "11111111-2222-3333-4444-555555555555"}; !equal(g.PodUIDs, want) {
		t.Errorf("pods %q, want %q", g.PodUIDs, want)
	}
	if want := []string{"10.0.0.5:8000", "10.244.1.17"}; !equal(g.Endpoints, want) {
		t.Errorf("endpoints %q, want %q", g.Endpoints, want)
	}
	if g1 := c.GPUs()[1]; len(g1.PodUIDs) != 0 || len(g1.Endpoints) != 0 {
		t.Errorf("GPU 1: %q %q", g1.PodUIDs, g1.Endpoints)
	}
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

func FuzzPodOfFiles(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/x\n", "|-- 10.1.2.3\n   /32 host LOCAL\n")
	f.Add("", "|-- not-an-ip\n/32 host LOCAL\n|-- 127.0.0.1\n/32 host LOCAL\n")
	f.Fuzz(func(t *testing.T, cgroup, fib string) {
		root := t.TempDir()
		for _, d := range []string{"self/ns", "1/ns", "1/net"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.Symlink("net:[1]", filepath.Join(root, "self", "ns", "net"))
		os.Symlink("net:[2]", filepath.Join(root, "1", "ns", "net"))
		os.WriteFile(filepath.Join(root, "1", "cgroup"), []byte(cgroup), 0o644)
		os.WriteFile(filepath.Join(root, "1", "net", "fib_trie"), []byte(fib), 0o644)
		uid, ips := gpu.PodOfForTest(root, 1)
		if uid != "" && len(uid) != 36 {
			t.Fatalf("uid %q", uid)
		}
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip); err != nil || a.IsLoopback() {
				t.Fatalf("address %q", ip)
			}
		}
	})
}
