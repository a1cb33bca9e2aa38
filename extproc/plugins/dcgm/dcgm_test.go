package dcgm

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/testutil"
)

// daemonSetPage is a DCGM exporter page of a node with two pods' GPUs
// (DCGM_EXPORTER_KUBERNETES=true adds the pod labels).
const daemonSetPage = `# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="vllm",namespace="llm",pod="vllm-0"} 35
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="vllm",namespace="llm",pod="vllm-0"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="vllm",namespace="llm",pod="vllm-1"} 12
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",pod="vllm-0"} 70000
`

func TestUtilization(t *testing.T) {
	for _, tc := range []struct {
		name, page, pod string
		want            float64
		ok              bool
		err             bool
	}{
		{name: "the pod's busiest GPU", page: daemonSetPage, pod: "vllm-0", want: 0.8, ok: true},
		{name: "another pod on the node", page: daemonSetPage, pod: "vllm-1", want: 0.12, ok: true},
		{name: "a name is matched whole", page: daemonSetPage, pod: "vllm-1-rank-1"},
		{name: "a pod without GPUs on the page", page: daemonSetPage, pod: "vllm-9"},
		{name: "sidecar page without pod labels", page: "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 100\nDCGM_FI_DEV_GPU_UTIL{gpu=\"1\"} 7\n", pod: "any", want: 1, ok: true},
		{name: "over 100 clamps", page: "DCGM_FI_DEV_GPU_UTIL 130\n", pod: "p", want: 1, ok: true},
		{name: "no utilization metric", page: "DCGM_FI_DEV_FB_USED 1\n", pod: "p"},
		{name: "NaN ignored", page: "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} NaN\n", pod: "p"},
		{name: "not a metrics page", page: "<html>oops</html>", pod: "p", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok, err := Utilization([]byte(tc.page), tc.pod)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if ok != tc.ok || (ok && v != tc.want) {
				t.Fatalf("got %v %v, want %v %v", v, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestReadRankOfPod: an endpoint that is one data-parallel rank of a pod
// reads its pod's GPUs; a one-port pod named like a rank reads its own.
func TestReadRankOfPod(t *testing.T) {
	xp, _ := NewExtractor("", nil, nil)
	x := xp.(*Extractor)
	rank := endpoints.NewEndpoint(endpoints.Spec{Name: endpoints.RankName("vllm-1", 1), Address: "10.0.0.2:8001",
		DataParallel: &endpoints.DataParallelRank{Server: "vllm-1", Rank: 1}})
	lookalike := endpoints.NewEndpoint(endpoints.Spec{Name: endpoints.RankName("vllm-1", 1), Address: "10.0.0.3:8000"})
	for _, e := range []*endpoints.Endpoint{rank, lookalike} {
		if err := x.Read(e, []byte(daemonSetPage)); err != nil {
			t.Fatal(err)
		}
	}
	if v, ok := x.Attribute(GPUUtilization, rank); !ok || v != 0.12 {
		t.Errorf("rank 1 of vllm-1: %v %v, want vllm-1's 0.12", v, ok)
	}
	if v, ok := x.Attribute(GPUUtilization, lookalike); ok {
		t.Errorf("a pod named %s: %v, want none (no pod of that name on the page)", lookalike.Name(), v)
	}
}

func TestParams(t *testing.T) {
	p, err := NewSource("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*Source)
	for addr, want := range map[string]string{
		"10.0.0.1:8000":    "http://10.0.0.1:9400/metrics",
		"[fd00::1]:8000":   "http://[fd00::1]:9400/metrics",
		"vllm.default.svc": "http://vllm.default.svc:9400/metrics",
	} {
		if got := s.URL(addr); got != want {
			t.Errorf("URL(%s) = %s, want %s", addr, got, want)
		}
	}
	p, _ = NewSource("", []byte(`{"scheme":"https","path":"/dcgm","port":9500}`), nil)
	if got := p.(*Source).URL("10.0.0.1:8000"); got != "https://10.0.0.1:9500/dcgm" {
		t.Errorf("URL = %s", got)
	}
	p, _ = NewSource("", []byte(`{"useNodeAddress":true}`), nil)
	ns := p.(*Source)
	for _, tc := range []struct {
		spec endpoints.Spec
		want string
	}{
		{endpoints.Spec{Name: "a", Address: "10.0.0.1:8000", NodeAddress: "192.168.0.7"}, "http://192.168.0.7:9400/metrics"},
		{endpoints.Spec{Name: "b", Address: "10.0.0.2:8000"}, ""}, // no node known: not fetched
	} {
		if got := ns.Poller.URL(endpoints.NewEndpoint(tc.spec)); got != tc.want {
			t.Errorf("node URL of %+v = %q, want %q", tc.spec, got, tc.want)
		}
	}
	for params, want := range map[string]string{
		`{"port":0}`:          "1-65535",
		`{"port":70000}`:      "1-65535",
		`{"scheme":"tcp"}`:    "want http or https",
		`{"interval":"-2s"}`:  "must not be negative",
		`{"caCertPath":"/x"}`: "unknown field",
	} {
		if _, err := NewSource("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
	x, _ := NewExtractor("", nil, nil)
	if err := x.(*Extractor).AcceptsSource(otherSource{scheduling.NewNamed("models-data-source", "")}); err == nil {
		t.Error("dcgm-extractor accepted another source")
	}
}

type otherSource struct{ scheduling.Named }

func (otherSource) DataLayerSource() {}

// TestPoll: a live exporter beside each endpoint; utilization follows the
// page, a page without the pod's GPUs removes it, a removed endpoint
// loses it.
func TestPoll(t *testing.T) {
	before := runtime.NumGoroutine()
	var util atomic.Int64
	util.Store(42)
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",pod=\"vllm-0\"} %d\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",pod=\"vllm-1\"} 5\n", util.Load())
	}))
	defer exporter.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(exporter.URL, "http://"))
	src, err := NewSource("dcgm", []byte(`{"port":`+port+`,"interval":"10ms"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	xp, _ := NewExtractor("dcgm-extractor", nil, nil)
	x := xp.(*Extractor)
	src.(*Source).Connect(x)
	ds := endpoints.NewDatastore()
	// vllm-0's exporter answers on its host; vllm-2's host (127.0.0.2)
	// runs none.
	if err := ds.Replace([]endpoints.Spec{{Name: "vllm-0", Address: "127.0.0.1:8000"}, {Name: "vllm-2", Address: "127.0.0.2:8000"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.(*Source).Poll(ctx, ds, 5*time.Millisecond) }()
	e0 := ds.Get("vllm-0")
	testutil.WaitFor(t, "utilization 0.42", func() bool { v, ok := x.Attribute(GPUUtilization, e0); return ok && v == 0.42 })
	util.Store(90)
	testutil.WaitFor(t, "utilization 0.9", func() bool { v, _ := x.Attribute(GPUUtilization, e0); return v == 0.9 })
	if _, ok := x.Attribute(GPUUtilization, ds.Get("vllm-2")); ok {
		t.Fatal("an endpoint whose exporter does not answer has a value")
	}
	if _, ok := x.Attribute("GPUMemory", e0); ok {
		t.Fatal("an unpublished attribute has a value")
	}
	if err := ds.Replace([]endpoints.Spec{{Name: "vllm-2", Address: "127.0.0.2:8000"}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "no utilization", func() bool { _, ok := x.Attribute(GPUUtilization, e0); return !ok })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	exporter.Close()
	testutil.NoGoroutineLeak(t, before, "dcgm poll")
}

func FuzzUtilization(f *testing.F) {
	f.Add([]byte(daemonSetPage), "vllm-0")
	f.Add([]byte("DCGM_FI_DEV_GPU_UTIL 1e400\n"), "p")
	f.Fuzz(func(t *testing.T, page []byte, pod string) {
		v, ok, err := Utilization(page, pod)
		if err == nil && ok && (v < 0 || v > 1) {
			t.Fatalf("utilization %v outside [0, 1]", v)
		}
	})
}
