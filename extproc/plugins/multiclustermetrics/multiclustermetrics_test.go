package multiclustermetrics

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics/peertest"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/testutil"
)

// peerPage is a remote picker's metrics page: its pool averages among the
// rest of its own metrics.
const peerPage = `# TYPE llm_d_epp_average_kv_cache_utilization gauge
llm_d_epp_average_kv_cache_utilization{name="pool-a"} 0.25
# TYPE llm_d_epp_average_queue_size gauge
llm_d_epp_average_queue_size{name="pool-a"} 7
# TYPE llm_d_epp_ready_pods gauge
llm_d_epp_ready_pods{name="pool-a"} 3
`

// TestPollPeers fetches a page from a real loopback server, http or https,
// through one poll round, and reads it into the cluster's attributes.
func TestPollPeers(t *testing.T) {
	cert, _ := testutil.SelfSignedCert(t)
	caPath := peertest.CAFile(t, cert)
	// 5 MiB of comments before the metrics: over the per-pod sources' 4
	// MiB, under this source's 8 MiB.
	bigPage := strings.Repeat("# "+strings.Repeat("x", 1022)+"\n", 5<<10) + peerPage
	hugePage := strings.Repeat("# "+strings.Repeat("x", 1022)+"\n", 9<<10) + peerPage
	for _, tc := range []struct {
		name      string
		tls       bool
		params    string // source parameters; %CA% is the CA bundle's path
		xparams   string // extractor parameters
		page      string
		path      string // the path the server answers on
		metricsAt bool   // the cluster's address is elsewhere; its metrics labels name the server
		kv, queue float64
		ok        bool
	}{
		{name: "https verified with caCertPath", tls: true, params: `{"caCertPath":"%CA%"}`, page: peerPage, kv: 0.25, queue: 7, ok: true},
		{name: "https verifies by default", tls: true, page: peerPage},
		{name: "insecureSkipVerify", tls: true, params: `{"insecureSkipVerify":true}`, page: peerPage, kv: 0.25, queue: 7, ok: true},
		{name: "plain http", params: `{"scheme":"http"}`, page: peerPage, kv: 0.25, queue: 7, ok: true},
		{name: "https default against plain http", page: peerPage},
		{name: "custom path", params: `{"scheme":"http","path":"/pool/metrics"}`, path: "/pool/metrics", page: peerPage, kv: 0.25, queue: 7, ok: true},
		{name: "separate metrics host", params: `{"scheme":"http"}`, metricsAt: true, page: peerPage, kv: 0.25, queue: 7, ok: true},
		{name: "5 MiB page", params: `{"scheme":"http"}`, page: bigPage, kv: 0.25, queue: 7, ok: true},
		{name: "page over 8 MiB", params: `{"scheme":"http"}`, page: hugePage},
		{name: "custom metric specs", params: `{"scheme":"http"}`, xparams: `{"kvCacheUtilizationMetric":"llm_d_epp_ready_pods{name=pool-a}","queueSizeMetric":"llm_d_epp_average_kv_cache_utilization"}`,
			page: peerPage, kv: 3, queue: 0.25, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = "/metrics"
			}
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != path {
					http.NotFound(w, r)
					return
				}
				_, _ = w.Write([]byte(tc.page))
			}))
			if tc.tls {
				srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
				srv.StartTLS()
			} else {
				srv.Start()
			}
			defer srv.Close()
			sp, err := NewSource("peers", []byte(strings.ReplaceAll(cmpOr(tc.params, "{}"), "%CA%", caPath)), nil)
			if err != nil {
				t.Fatal(err)
			}
			xp, err := NewExtractor("x", []byte(cmpOr(tc.xparams, "{}")), nil)
			if err != nil {
				t.Fatal(err)
			}
			s, x := sp.(*Source), xp.(*Extractor)
			if err := x.AcceptsSource(s); err != nil {
				t.Fatal(err)
			}
			s.Connect(x)
			addr := srv.Listener.Addr().String()
			spec := endpoints.Spec{Name: "cluster-a", Address: addr}
			if tc.metricsAt {
				host, port, _ := net.SplitHostPort(addr)
				spec = endpoints.Spec{Name: "cluster-a", Address: "127.0.0.9:1", Labels: map[string]string{MetricsAddressLabel: host, MetricsPortLabel: port}}
			}
			e := endpoints.NewEndpoint(spec)
			s.Poller.Round(t.Context(), []*endpoints.Endpoint{e}, 5e9, s.Readers())
			s.Poller.CloseIdleConnections()
			kv, kok := x.Attribute(KVCacheUtilization, e)
			q, qok := x.Attribute(QueueSize, e)
			if kok != tc.ok || qok != tc.ok || kv != tc.kv || q != tc.queue {
				t.Fatalf("kv %v %v, queue %v %v; want %v %v %v", kv, kok, q, qok, tc.kv, tc.queue, tc.ok)
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestURL(t *testing.T) {
	p, err := NewSource("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*Source)
	for _, tc := range []struct {
		spec endpoints.Spec
		want string
	}{
		{endpoints.Spec{Name: "a", Address: "10.0.0.1:443"}, "https://10.0.0.1:443/metrics"},
		{endpoints.Spec{Name: "b", Address: "10.0.0.1:443", Labels: map[string]string{MetricsAddressLabel: "epp.cluster-b.example"}}, "https://epp.cluster-b.example:443/metrics"},
		{endpoints.Spec{Name: "c", Address: "10.0.0.1:443", Labels: map[string]string{MetricsAddressLabel: "10.1.0.5", MetricsPortLabel: "9090"}}, "https://10.1.0.5:9090/metrics"},
		{endpoints.Spec{Name: "d", Address: "10.0.0.1:443", Labels: map[string]string{MetricsPortLabel: "9090"}}, "https://10.0.0.1:443/metrics"}, // a port alone: the address
	} {
		if got := s.URL(endpoints.NewEndpoint(tc.spec)); got != tc.want {
			t.Errorf("URL(%+v) = %s, want %s", tc.spec, got, tc.want)
		}
	}
}

func TestParams(t *testing.T) {
	for params, want := range map[string]string{
		`{"scheme":"tcp"}`:            "want http or https",
		`{"interval":"-2s"}`:          "must not be negative",
		`{"caCertPath":"/nonexist"}`:  "caCertPath",
		`{"clientCertPath":"/a.crt"}`: "set together",
		`{"port":9090}`:               "unknown field",
	} {
		if _, err := NewSource("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("source %s: err = %v, want %q", params, err, want)
		}
	}
	for params, want := range map[string]string{
		`{"queueSizeMetric":"{x=1}"}`:         "queueSizeMetric",
		`{"kvCacheUtilizationMetric":"a b{"}`: "kvCacheUtilizationMetric",
		`{"engineConfigs":[]}`:                "unknown field",
	} {
		if _, err := NewExtractor("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("extractor %s: err = %v, want %q", params, err, want)
		}
	}
	x, _ := NewExtractor("", nil, nil)
	if err := x.(*Extractor).AcceptsSource(otherSource{scheduling.NewNamed("metrics-data-source", "")}); err == nil {
		t.Error("the extractor accepted another source")
	}
}

type otherSource struct{ scheduling.Named }

func (otherSource) DataLayerSource() {}

func TestFind(t *testing.T) {
	a, _ := NewExtractor("a", nil, nil)
	b, _ := NewExtractor("b", nil, nil)
	src, _ := NewSource("s", nil, nil)
	if _, err := Find([]scheduling.Plugin{src}); err == nil || !strings.Contains(err.Error(), ExtractorType) {
		t.Errorf("none: err = %v", err)
	}
	if got, err := Find([]scheduling.Plugin{src, a}); err != nil || got != a {
		t.Errorf("one: %v %v", got, err)
	}
	if _, err := Find([]scheduling.Plugin{a, b}); err == nil || !strings.Contains(err.Error(), "two") {
		t.Errorf("two: err = %v", err)
	}
}

// A cluster removed from the pool loses its values; a page without a
// metric keeps its previous value (as llm-d) and says so.
func TestKeepAndMissing(t *testing.T) {
	xp, _ := NewExtractor("", nil, nil)
	x := xp.(*Extractor)
	e := endpoints.NewEndpoint(endpoints.Spec{Name: "a", Address: "10.0.0.1:443"})
	if err := x.Read(e, []byte(peerPage)); err != nil {
		t.Fatal(err)
	}
	if err := x.Read(e, []byte("llm_d_epp_average_queue_size 2\n")); err == nil || !strings.Contains(err.Error(), DefaultKVCacheUtilizationMetric) {
		t.Fatalf("a page without the KV metric: err = %v", err)
	}
	if v, ok := x.Attribute(KVCacheUtilization, e); !ok || v != 0.25 {
		t.Errorf("a metric missing from the page: %v %v, want the previous 0.25", v, ok)
	}
	fresh := endpoints.NewEndpoint(endpoints.Spec{Name: "b", Address: "10.0.0.3:443"})
	_ = x.Read(fresh, []byte("llm_d_epp_average_queue_size 1\n"))
	if _, ok := x.Attribute(KVCacheUtilization, fresh); ok {
		t.Error("a cluster that never had the metric has a value")
	}
	if v, ok := x.Attribute(QueueSize, e); !ok || v != 2 {
		t.Errorf("queue = %v %v", v, ok)
	}
	if err := x.Read(e, []byte("<html>")); err == nil {
		t.Error("a page that is not Prometheus text was read")
	}
	if v, _ := x.Attribute(QueueSize, e); v != 2 {
		t.Error("an unreadable page changed the values")
	}
	x.Keep(map[string]bool{"10.0.0.2:443": true})
	if _, ok := x.Attribute(QueueSize, e); ok {
		t.Error("a removed cluster kept its values")
	}
}
