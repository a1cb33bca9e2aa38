package epp

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// One server that takes one request at a time (concurrency-detector,
// maxConcurrency 1), a band of two queued requests, a 3s TTL (long enough
// for a loaded machine to take the test's steps before it runs out).
const flowControlConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates:
- flowControl
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters:
    maxConcurrency: 1
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
flowControl:
  defaultRequestTTL: 3s
  saturationDetector:
    pluginRef: concurrency-detector
  defaultPriorityBand:
    maxRequests: 2
`

// metric is the value of the first sample of name whose labels contain
// every one of labels, or -1.
func metric(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
next:
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		for _, l := range labels {
			if !strings.Contains(m[1], l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return -1
}

func droppedReason(ir *extprocv3.ImmediateResponse) string {
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-llm-d-request-dropped-reason" {
			return string(h.GetHeader().GetRawValue()) + h.GetHeader().GetValue()
		}
	}
	return ""
}

// The picker holds requests while its one server is busy, dispatches the
// next the moment the running one's response ends (a release, not a
// scrape), refuses a full band with 429 rejected-saturated, removes a
// cancelled request from the queue, expires one past its TTL with 429
// rejected-ttl-expired, and exports the flow_control_* metrics.
func TestFlowControlOverLoopback(t *testing.T) {
	f := startFleet(t, flowControlConfig, vllmMetrics(0, 0, ""))
	queued := func() float64 {
		return metric(t, f.metrics, "llm_d_epp_flow_control_queue_size", `priority="0"`)
	}

	running, r := f.route(t, nil, completion, 1)
	if got := f.destination(t, r); got != f.servers[0].addr {
		t.Fatalf("first request routed to %q", got)
	}

	type result struct {
		r   *extprocv3.ProcessingResponse
		err error
	}
	wait := func(s *envoytest.Stream) chan result {
		ch := make(chan result, 1)
		go func() { r, err := s.Stream.Recv(); ch <- result{r, err} }()
		return ch
	}
	open := func() *envoytest.Stream {
		s := envoytest.Open(t, f.client)
		s.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
		s.Send(envoytest.RequestBody([]byte(completion), true))
		return s
	}
	second, third := open(), open()
	secondDone, thirdDone := wait(second), wait(third)
	testutil.WaitFor(t, "two queued", func() bool { return queued() == 2 })

	// The band is full.
	_, r = f.route(t, nil, completion, 1)
	ir := envoytest.ImmediateError(t, r, 429, inferr.ResourceExhausted)
	if got := droppedReason(ir); got != "rejected-saturated" {
		t.Errorf("dropped reason %q", got)
	}

	// The third client goes away: its request leaves the queue.
	third.Cancel()
	if res := <-thirdDone; res.err == nil {
		t.Fatalf("cancelled stream answered %v", res.r)
	}
	testutil.WaitFor(t, "cancelled request removed", func() bool { return queued() == 1 })

	// The running response ends: the second is dispatched.
	running.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"))
	running.Recv()
	running.Send(envoytest.ResponseBody([]byte(`{"usage":{"prompt_tokens":5,"completion_tokens":8}}`), true))
	running.Recv()
	res := <-secondDone
	if res.err != nil {
		t.Fatal(res.err)
	}
	if got := f.destination(t, res.r); got != f.servers[0].addr {
		t.Fatalf("second request routed to %q", got)
	}

	// The second now runs; a fourth waits out its TTL.
	_, r = f.route(t, nil, completion, 1)
	ir = envoytest.ImmediateError(t, r, 429, inferr.ResourceExhausted)
	if got := droppedReason(ir); got != "rejected-ttl-expired" {
		t.Errorf("dropped reason %q", got)
	}

	for _, m := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"llm_d_epp_flow_control_requests_total", []string{`outcome="Dispatched"`}, 2},
		{"llm_d_epp_flow_control_requests_total", []string{`outcome="RejectedCapacity"`}, 1},
		{"inference_extension_flow_control_requests_total", []string{`outcome="EvictedContextCancelled"`}, 1},
		{"llm_d_epp_flow_control_requests_total", []string{`outcome="EvictedTTL"`}, 1},
		{"llm_d_epp_flow_control_pool_saturation", []string{`stage="effective"`}, 1},
		{"llm_d_epp_flow_control_pool_saturation", []string{`stage="decode"`}, 1},
		{"llm_d_epp_flow_control_queue_size", []string{`priority="0"`, `fairness_id="default-flow"`}, 0},
		{"llm_d_epp_flow_control_request_queue_duration_seconds_count", []string{`outcome="Dispatched"`}, 2},
	} {
		if got := metric(t, f.metrics, m.name, m.labels...); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
}

// The llm-d flow-control guide over loopback: its EndpointPickerConfig (with
// maxConcurrency 1 instead of 132, so that one request saturates the one
// server) and its InferenceObjectives; a premium request queued after a
// best-effort one is dispatched first.
func TestFlowControlGuideOverLoopback(t *testing.T) {
	cfg, err := os.ReadFile(filepath.Join("..", "config", "testdata", "flowcontrol", "llm-d-flow-control-guide.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(cfg), "maxConcurrency: 132", "maxConcurrency: 1", 1)
	if _, err := config.Parse([]byte(text)); err != nil && strings.Contains(err.Error(), "apiVersion") {
		// apiVersion llm-d.ai/v1 is the config loader's to accept.
		text = regexp.MustCompile(`(?m)^apiVersion: .*$`).ReplaceAllString(text, "apiVersion: "+config.APIVersionLLM)
	}
	f := startFleetWith(t, func(o *Options) {
		o.ConfigText, o.PoolName = text, "flow-control"
		o.ObjectivesFile = filepath.Join("testdata", "flow-control-objectives.yaml")
	}, vllmMetrics(0, 0, ""))

	finish := func(s *envoytest.Stream) {
		s.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"))
		s.Recv()
		s.Send(envoytest.ResponseBody([]byte(`{}`), true))
		s.Recv()
	}
	running, _ := f.route(t, []string{"x-gateway-inference-objective", "standard-traffic"}, completion, 1)
	type result struct {
		s   *envoytest.Stream
		r   *extprocv3.ProcessingResponse
		err error
	}
	done := make(chan result, 2)
	send := func(objective string) {
		s := envoytest.Open(t, f.client)
		s.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions", "x-gateway-inference-objective", objective))
		s.Send(envoytest.RequestBody([]byte(completion), true))
		go func() { r, err := s.Stream.Recv(); done <- result{s, r, err} }()
	}
	band := func(p string) float64 {
		return metric(t, f.metrics, "llm_d_epp_flow_control_queue_size", `priority="`+p+`"`)
	}
	send("best-effort-traffic")
	testutil.WaitFor(t, "best effort queued", func() bool { return band("-10") == 1 })
	send("premium-traffic")
	testutil.WaitFor(t, "premium queued", func() bool { return band("100") == 1 })

	finish(running)
	first := <-done
	if first.err != nil || band("100") != 0 || band("-10") != 1 {
		t.Fatalf("after one release: err %v, queued premium %v best-effort %v", first.err, band("100"), band("-10"))
	}
	finish(first.s)
	if second := <-done; second.err != nil || f.destination(t, second.r) != f.servers[0].addr {
		t.Fatalf("best-effort request: %v", second.err)
	}
}

// At shutdown the picker refuses its queued requests at once with 503
// rejected-shutting-down, and leaves the whole drain to the requests it
// already routed: a response in flight streams to its end, where waiting
// for the saturated queue first would spend the drain and then cut it.
func TestShutdownRefusesQueueAndDrainsInFlight(t *testing.T) {
	f := startFleetWith(t, func(o *Options) {
		// A TTL past the test, so that only the shutdown takes the
		// queued request out; a drain shorter than the test's streams,
		// so that spending it on the queue would cut the running one.
		o.ConfigText = strings.Replace(flowControlConfig, "defaultRequestTTL: 3s", "defaultRequestTTL: 1m", 1)
		o.DrainTimeout = envoytest.StreamTimeout * 3 / 4
	}, vllmMetrics(0, 0, ""))
	running, r := f.route(t, nil, completion, 1)
	if got := f.destination(t, r); got != f.servers[0].addr {
		t.Fatalf("first request routed to %q", got)
	}
	queued := envoytest.Open(t, f.client)
	queued.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	queued.Send(envoytest.RequestBody([]byte(completion), true))
	testutil.WaitFor(t, "one queued", func() bool {
		return metric(t, f.metrics, "llm_d_epp_flow_control_queue_size", `priority="0"`) == 1
	})

	stopped := make(chan error, 1)
	go func() { stopped <- f.stop() }()
	ir := envoytest.ImmediateError(t, queued.Recv(), 503, inferr.ServiceUnavailable)
	if got := droppedReason(ir); got != "rejected-shutting-down" {
		t.Errorf("queued request's dropped reason %q, want rejected-shutting-down", got)
	}
	select {
	case err := <-stopped:
		t.Fatalf("picker stopped (%v) with a response in flight", err)
	default:
	}

	// The running response still streams, to its end.
	running.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"))
	running.Recv()
	running.Send(envoytest.ResponseBody([]byte(`{"usage":{"prompt_tokens":5,"completion_tokens":8}}`), true))
	for !running.Recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
	}
	if err := running.Stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if m, err := running.Stream.Recv(); err != io.EOF {
		t.Fatalf("running stream ended with %v %v, want its end (EOF)", m, err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
