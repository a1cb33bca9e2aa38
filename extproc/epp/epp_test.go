package epp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// modelServer is a stand-in for a vLLM server as the picker sees it: an HTTP
// server on its own loopback IP whose /metrics page the test controls.
type modelServer struct {
	addr string
	mu   sync.Mutex
	page string
	// path is the last path scraped.
	path string
}

func (m *modelServer) set(page string) {
	m.mu.Lock()
	m.page = page
	m.mu.Unlock()
}

func startModelServer(t testing.TB, ip, page string) *modelServer {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	m := &modelServer{addr: ln.Addr().String(), page: page}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.path = r.URL.Path
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, m.page)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return m
}

// vllmMetrics renders the vLLM gauges the picker reads.
func vllmMetrics(waiting int, kv float64, activeLoRAs string) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} %d
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 1
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="base"} %g
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="%s",waiting_lora_adapters=""} 1.7e+09
`, waiting, kv, activeLoRAs)
}

// fleet starts servers with the given metric pages and a picker over them,
// returning an ext_proc client, the servers, and the picker's metrics URL.
type fleet struct {
	client  extprocv3.ExternalProcessorClient
	servers []*modelServer
	metrics string
	file    string
	picker  *Picker
	stop    func() error // see startPicker
}

func startFleet(t testing.TB, config string, pages ...string) *fleet {
	t.Helper()
	return startFleetWith(t, func(o *Options) { o.ConfigText = config }, pages...)
}

func startFleetWith(t testing.TB, configure func(*Options), pages ...string) *fleet {
	t.Helper()
	f := &fleet{file: filepath.Join(t.TempDir(), "endpoints.yaml")}
	var b strings.Builder
	b.WriteString("endpoints:\n")
	for i, page := range pages {
		s := startModelServer(t, fmt.Sprintf("127.0.0.%d", i+2), page)
		f.servers = append(f.servers, s)
		fmt.Fprintf(&b, "- name: pod-%d\n  address: %s\n", i, s.addr)
	}
	if len(pages) == 0 {
		b.WriteString("  []\n")
	}
	if err := os.WriteFile(f.file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.EndpointsFile = f.file
	o.GRPCAddr, o.HealthAddr, o.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.RefreshMetricsInterval = 10 * time.Millisecond
	configure(&o)
	p, stop := startPicker(t, o)
	f.picker, f.stop = p, stop
	grpcAddr, _, metricsAddr := p.Addrs()
	f.client = envoytest.Dial(t, grpcAddr)
	f.metrics = "http://" + metricsAddr + "/metrics"
	// Requests are meaningful once every server has been scraped.
	testutil.WaitFor(t, "endpoints scraped", func() bool {
		all := p.Datastore().All()
		if len(all) != len(pages) {
			return false
		}
		for _, e := range all {
			if e.Metrics().UpdateTime.IsZero() {
				return false
			}
		}
		return true
	})
	return f
}

// runPicker runs a picker with o until the test ends, once it listens.
func runPicker(t testing.TB, o Options) *Picker {
	t.Helper()
	p, _ := startPicker(t, o)
	return p
}

// startPicker runs a picker with o, once it listens. stop ends its Run
// (as a signal would) and returns Run's error once Run has returned; the
// test's end stops it if the test did not.
func startPicker(t testing.TB, o Options) (p *Picker, stop func() error) {
	t.Helper()
	p, err := New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("picker exited: %v", err)
		}
	})
	select {
	case <-p.Listening():
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("picker exited before listening: %v", err)
	}
	return p, stop
}

const completion = `{"model":"base","prompt":"Hello, my name is","max_tokens":8}`

// route sends one request (headers, then the body in chunks) and returns
// the picker's first response.
func (f *fleet) route(t *testing.T, headers []string, body string, chunks int, meta ...*extprocv3.ProcessingRequest) (*envoytest.Stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	s := envoytest.Open(t, f.client)
	h := envoytest.WithModes(envoytest.RequestHeaders(body == "", append([]string{":method", "POST", ":path", "/v1/completions"}, headers...)...),
		procmode.ProcessingMode_FULL_DUPLEX_STREAMED, procmode.ProcessingMode_FULL_DUPLEX_STREAMED)
	if len(meta) > 0 {
		h.MetadataContext = meta[0].MetadataContext
	}
	s.Send(h)
	if body != "" {
		step := max(1, (len(body)+chunks-1)/chunks)
		for i := 0; i < len(body); i += step {
			end := min(len(body), i+step)
			s.Send(envoytest.RequestBody([]byte(body[i:end]), end == len(body)))
		}
	}
	return s, s.Recv()
}

func (f *fleet) destination(t *testing.T, r *extprocv3.ProcessingResponse) string {
	t.Helper()
	return envoytest.SetHeaders(t, r)["x-gateway-destination-endpoint"]
}

// The default profile prefers the endpoint with less queue and KV use.
func TestLowerQueueAndKVWins(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(8, 0.9, ""), vllmMetrics(0, 0.1, ""), vllmMetrics(3, 0.5, ""))
	for range 5 {
		_, r := f.route(t, nil, completion, 1)
		if got := f.destination(t, r); got != f.servers[1].addr {
			t.Fatalf("routed to %s, want the idle %s", got, f.servers[1].addr)
		}
	}
	// Metrics change: the picker follows its scrapes.
	f.servers[1].set(vllmMetrics(20, 0.95, ""))
	f.servers[2].set(vllmMetrics(0, 0.05, ""))
	testutil.WaitFor(t, "re-scrape", func() bool {
		_, r := f.route(t, nil, completion, 1)
		return f.destination(t, r) == f.servers[2].addr
	})
}

// An endpoint with the adapter loaded beats one with a lower KV use.
func TestLoRAAffinityBeatsLowerKV(t *testing.T) {
	const cfg = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: lora-affinity-scorer
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: lora-affinity-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
`
	f := startFleet(t, cfg, vllmMetrics(0, 0.1, "other-a,other-b"), vllmMetrics(0, 0.4, "sql-lora"))
	body := `{"model":"sql-lora","prompt":"select"}`
	_, r := f.route(t, nil, body, 1)
	if got := f.destination(t, r); got != f.servers[1].addr {
		t.Fatalf("routed to %s, want the adapter holder %s", got, f.servers[1].addr)
	}
}

// The body arriving in many frames is reassembled, decided on, and re-sent.
func TestBodySplitAcrossFrames(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(0, 0, ""))
	body := `{"model":"base","prompt":"` + strings.Repeat("x", 5000) + `"}`
	s, r := f.route(t, nil, body, 37)
	if got := f.destination(t, r); got != f.servers[0].addr {
		t.Fatalf("destination %q", got)
	}
	var resent []byte
	for {
		chunk := envoytest.StreamedChunk(t, s.Recv().GetRequestBody())
		resent = append(resent, chunk.GetBody()...)
		if chunk.GetEndOfStream() {
			break
		}
	}
	if string(resent) != body {
		t.Fatalf("body re-sent as %d bytes, want the original %d", len(resent), len(body))
	}
}

func TestClientErrors(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(0, 0, ""))
	tests := []struct {
		name string
		body string
	}{
		{"invalid JSON", `{"model": "base", "prompt": `},
		{"missing model", `{"prompt":"hi"}`},
		{"empty prompt", `{"model":"base","prompt":""}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, r := f.route(t, nil, tc.body, 2)
			envoytest.ImmediateError(t, r, 400, inferr.BadRequest)
		})
	}
}

func subsetHint(addrs ...string) *extprocv3.ProcessingRequest {
	vals := make([]*structpb.Value, len(addrs))
	for i, a := range addrs {
		vals[i] = structpb.NewStringValue(a)
	}
	return envoytest.WithMetadata(&extprocv3.ProcessingRequest{}, "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", structpb.NewListValue(&structpb.ListValue{Values: vals}))
}

func TestSubsetHint(t *testing.T) {
	// Server 0 is the obvious choice on load; the hint must override it.
	f := startFleet(t, "", vllmMetrics(0, 0, ""), vllmMetrics(9, 0.9, ""), vllmMetrics(9, 0.9, ""))
	ip2 := strings.Split(f.servers[2].addr, ":")[0]
	tests := []struct {
		name string
		hint []string
		want string // "" = 503
	}{
		{"ip:port", []string{f.servers[1].addr}, f.servers[1].addr},
		{"ip only", []string{ip2}, f.servers[2].addr},
		{"ip with another port: match on IP", []string{ip2 + ":1"}, f.servers[2].addr},
		{"matches nothing", []string{"10.9.9.9"}, ""},
		{"empty", []string{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, r := f.route(t, nil, completion, 1, subsetHint(tc.hint...))
			if tc.want == "" {
				envoytest.ImmediateError(t, r, 503, inferr.ServiceUnavailable)
				return
			}
			if got := f.destination(t, r); got != tc.want {
				t.Fatalf("routed to %s, want %s", got, tc.want)
			}
		})
	}
}

func TestNoEndpoints(t *testing.T) {
	f := startFleet(t, "")
	_, r := f.route(t, nil, completion, 1)
	envoytest.ImmediateError(t, r, 503, inferr.ServiceUnavailable)
	// A request without a body and no endpoints is GIE's 500.
	s := envoytest.Open(t, f.client)
	s.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
	envoytest.ImmediateError(t, s.Recv(), 500, inferr.Internal)
}

func TestFallbackListOfThree(t *testing.T) {
	const cfg = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
`
	f := startFleet(t, cfg, vllmMetrics(4, 0, ""), vllmMetrics(0, 0, ""), vllmMetrics(8, 0, ""), vllmMetrics(2, 0, ""))
	_, r := f.route(t, nil, completion, 1)
	want := strings.Join([]string{f.servers[1].addr, f.servers[3].addr, f.servers[0].addr}, ",")
	if got := f.destination(t, r); got != want {
		t.Fatalf("destination %q, want %q", got, want)
	}
	lb := r.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	if lb != want {
		t.Fatalf("envoy.lb metadata %q, want %q", lb, want)
	}
	if !r.GetRequestHeaders().GetResponse().GetClearRouteCache() {
		t.Fatal("clear_route_cache not set")
	}
}

func TestModelRewriteHeader(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(0, 0, ""))
	s, r := f.route(t, []string{"x-gateway-model-name-rewrite", "base-v2"}, completion, 1)
	if f.destination(t, r) == "" {
		t.Fatal("no destination")
	}
	chunk := envoytest.StreamedChunk(t, s.Recv().GetRequestBody())
	want := `{"model":"base-v2","prompt":"Hello, my name is","max_tokens":8}`
	if string(chunk.GetBody()) != want || !chunk.GetEndOfStream() {
		t.Fatalf("body %s, want %s", chunk.GetBody(), want)
	}
}

// The response streams back unchanged, chunk by chunk, and its usage shows
// up in the picker's metrics.
func TestSSEPassthroughWithUsage(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(0, 0, ""))
	s, r := f.route(t, nil, `{"model":"base","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, 1)
	if f.destination(t, r) == "" {
		t.Fatal("no destination")
	}
	s.Recv() // the re-sent body
	s.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	if s.Recv().GetResponseHeaders() == nil {
		t.Fatal("want a response headers reply")
	}
	events := []string{
		"data: {\"id\":\"c1\",\"choices\":[{\"text\":\" there\"}]}\n\n",
		"data: {\"id\":\"c1\",\"choices\":[{\"text\":\"!\"}]}\n\n",
		"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
		"data: [DONE]\n\n",
	}
	for i, ev := range events {
		s.Send(envoytest.ResponseBody([]byte(ev), i == len(events)-1))
		chunk := envoytest.StreamedChunk(t, s.Recv().GetResponseBody())
		if string(chunk.GetBody()) != ev {
			t.Fatalf("chunk %d = %q, want %q", i, chunk.GetBody(), ev)
		}
	}
	testutil.WaitFor(t, "usage in metrics", func() bool {
		page := getPage(t, f.metrics)
		return strings.Contains(page, `inference_objective_input_tokens_sum{model_name="base",target_model_name="base"} 7`) &&
			strings.Contains(page, `llm_d_epp_request_cached_tokens_sum{fairness_id="default-flow",model_name="base",priority="0",target_model_name="base"} 4`) &&
			strings.Contains(page, `inference_objective_request_ttft_seconds_count{model_name="base",target_model_name="base"} 1`) &&
			strings.Contains(page, `kvgate_prefix_predicted_cached_tokens_count{plugin_type="prefix-cache-scorer"} 1`) &&
			strings.Contains(page, `kvgate_prefix_prediction_error_tokens_count{plugin_type="prefix-cache-scorer"} 1`)
	})
}

func getPage(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Edits to the endpoints file take effect without a restart.
func TestEndpointsFileWatched(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(0, 0, ""))
	extra := startModelServer(t, "127.0.0.9", vllmMetrics(0, 0, ""))
	f.servers[0].set(vllmMetrics(50, 0.99, ""))
	if err := os.WriteFile(f.file, []byte(fmt.Sprintf("endpoints:\n- name: pod-0\n  address: %s\n- name: pod-9\n  address: %s\n", f.servers[0].addr, extra.addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "new endpoint routed to", func() bool {
		_, r := f.route(t, nil, completion, 1)
		return f.destination(t, r) == extra.addr
	})
}

// The health service reports SERVING once discovery delivered its first
// set, on the health port and on the ext_proc port (for Envoy's checks).
func TestHealthServing(t *testing.T) {
	f := startFleet(t, "")
	grpcAddr, healthAddr, _ := f.picker.Addrs()
	for _, addr := range []string{healthAddr, grpcAddr} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		c := healthpb.NewHealthClient(conn)
		// llm-d's named checks, GIE's chart probe service and the
		// overall "" service all report SERVING.
		for _, svc := range []string{"", "liveness", "readiness", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor"} {
			testutil.WaitFor(t, "SERVING on "+addr+" for service "+svc, func() bool {
				r, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
				return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
			})
		}
		if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "no-such-service"}); status.Code(err) != codes.NotFound {
			t.Fatalf("unknown service: err = %v, want NotFound", err)
		}
	}
}

// A client cannot name the prefiller, the encoders or the KV source: the
// picker removes those headers unless it sets them itself.
func TestClientPrefillerHeaderRemoved(t *testing.T) {
	f := startFleet(t, "", vllmMetrics(0, 0, ""))
	_, r := f.route(t, []string{"x-prefiller-host-port", "10.9.9.9:6379"}, completion, 1)
	removed := r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	// Every spelling of them, the x-llm-d-… ones included.
	want := slices.DeleteFunc(eppwire.PickerOnlyHeaders(), func(h string) bool { return h == eppwire.HeaderDestination })
	if !slices.Equal(removed, want) || !slices.Contains(removed, "x-prefiller-host-port") {
		t.Fatalf("remove_headers = %v, want %v", removed, want)
	}
	if _, set := envoytest.SetHeaders(t, r)["x-prefiller-host-port"]; set {
		t.Fatal("client's prefiller passed on")
	}
}
