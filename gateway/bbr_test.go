package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/testutil"
)

// Body-based routing sets X-Gateway-Model-Name from the body's model (over
// a client's own), passes every other body on unchanged, and counts each
// outcome in BBR's metric families; bodiless and non-OpenAI requests are
// not its business.
func TestBodyBasedRouting(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := gateway.NewBBRMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	url := startGateway(t, gateway.Config{Fallback: []string{up.addr()}, BodyBasedRouting: m})
	const prompt = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, path, body, wantHeader string
	}{
		{"model", "/v1/chat/completions", `{"model":"Qwen/Qwen3-0.6B",` + prompt + `}`, "Qwen/Qwen3-0.6B"},
		{"client header replaced", "/v1/completions", `{"model":"m2","prompt":"x"}`, "m2"},
		{"no model", "/v1/chat/completions", `{` + prompt + `}`, "forged"},
		{"null model", "/v1/chat/completions", `{"model":null,` + prompt + `}`, "forged"},
		{"empty model", "/v1/chat/completions", `{"model":"",` + prompt + `}`, "forged"},
		{"model not a string", "/v1/chat/completions", `{"model":7,` + prompt + `}`, "forged"},
		{"not JSON", "/v1/chat/completions", `{"model":"m"`, "forged"},
		{"trailing data", "/v1/chat/completions", `{"model":"m"} {}`, "forged"},
		{"control character", "/v1/chat/completions", `{"model":"a\nb"}`, "forged"},
		{"not an OpenAI path", "/other", `{"model":"m"}`, "forged"},
	} {
		resp, _ := post(t, http.DefaultClient, url+tc.path, tc.body, map[string]string{"X-Gateway-Model-Name": "forged"})
		saw := up.next(t)
		if resp.StatusCode != http.StatusOK || string(saw.body) != tc.body {
			t.Errorf("%s: status %d, upstream body %q", tc.name, resp.StatusCode, saw.body)
		}
		if got := saw.header.Values("X-Gateway-Model-Name"); len(got) != 1 || got[0] != tc.wantHeader {
			t.Errorf("%s: X-Gateway-Model-Name %q, want %q", tc.name, got, tc.wantHeader)
		}
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	up.next(t)

	want := map[string]float64{
		"bbr_success_total": 2, "bbr_model_not_in_body_total": 3, "bbr_model_not_parsed_total": 4,
		"bbr_body_field_not_found_total": 2, "bbr_body_field_empty_total": 1,
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			if f.GetName() == "bbr_plugin_duration_seconds" {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if s.GetHistogram().GetSampleCount() != 9 || labels["plugin_type"] != "body-field-to-header" || labels["extension_point"] != "request" {
					t.Errorf("bbr_plugin_duration_seconds %v: %d samples, want 9", labels, s.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	for name, v := range want {
		var got float64
		for _, f := range fams {
			if f.GetName() == name {
				for _, s := range f.GetMetric() {
					got += s.GetCounter().GetValue()
				}
			}
		}
		if got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
}

// A body over the buffer limit cannot be read for its model: 413, as for
// the filter.
func TestBodyBasedRoutingBufferLimit(t *testing.T) {
	m, err := gateway.NewBBRMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	url := startGateway(t, gateway.Config{Fallback: []string{up.addr()}, BodyBasedRouting: m, MaxRequestBuffer: 64})
	resp, _ := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("x", 100)+`"}`, nil)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
}

func FuzzBodyModel(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"model":7}`, `{}`, `[]`, `null`, `{"model":"\u0000"}`, `{"model":"a"} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		model, outcome := gateway.BodyModel(body)
		if (outcome == "success") != (model != "") {
			t.Fatalf("%q: model %q, outcome %q", body, model, outcome)
		}
		for i := 0; i < len(model); i++ {
			if model[i] < 0x20 || model[i] == 0x7f {
				t.Fatalf("%q: model %q carries a control byte", body, model)
			}
		}
	})
}

// `kvgate gateway --body-based-routing --metrics-addr` serves BBR's series
// with the requests it routed counted.
func TestBodyBasedRoutingMetricsEndpoint(t *testing.T) {
	up := newUpstream(t, nil)
	o := gateway.DefaultOptions()
	// Port 0 for both; Run's log lines give the addresses bound.
	o.Listen, o.MetricsAddr, o.ExtProc, o.WasmPath = "127.0.0.1:0", "127.0.0.1:0", "", ""
	o.Fallback, o.BodyBasedRouting = up.addr(), true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs testutil.SyncBuffer
	go func() { done <- gateway.Run(ctx, o, slog.New(slog.NewTextHandler(&logs, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	bound := func(msg string) string {
		m := regexp.MustCompile(`msg="` + msg + `" addr=(\S+)`).FindStringSubmatch(logs.String())
		if m == nil {
			return ""
		}
		return m[1]
	}
	testutil.WaitFor(t, "the gateway's listening lines", func() bool { return bound("gateway listening") != "" && bound("gateway metrics") != "" })
	addr, metricsAddr := bound("gateway listening"), bound("gateway metrics")
	var page string
	for end := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
		if err == nil {
			resp.Body.Close()
			if m, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
				b, _ := io.ReadAll(m.Body)
				m.Body.Close()
				page = string(b)
				break
			}
		}
		if time.Now().After(end) {
			t.Fatalf("gateway not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if saw := up.next(t); saw.header.Get("X-Gateway-Model-Name") != "m" {
		t.Errorf("upstream saw X-Gateway-Model-Name %q", saw.header.Get("X-Gateway-Model-Name"))
	}
	for _, want := range []string{"bbr_success_total 1", "bbr_model_not_in_body_total 0", `bbr_body_field_empty_total{field="model"} 0`, "go_goroutines"} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
