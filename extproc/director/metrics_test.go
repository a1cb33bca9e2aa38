package director

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/metrics"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/openai"
)

// A model server's non-200 answer is the request's error, counted with
// code ModelServerError as llm-d does; the running gauge follows each
// request from its decision to the end of its response, whatever the
// status; a 200 is no error.
func TestModelServerErrorsCounted(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg)
	a := schedtest.Endpoint("a", endpoints.Metrics{})
	d := liveDirector(t, pool{a}, time.Now)
	d.metrics = m
	ctx := context.Background()
	running := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "llm_d_epp_request_running" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	for _, tc := range []struct {
		status     int
		wantErrors float64
	}{{200, 0}, {404, 1}, {500, 2}, {200, 2}} {
		req := completion("hello there", false)
		req.Body = []byte(`{"model":"m","prompt":"hello there"}`)
		_, ex, err := d.HandleRequest(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if got := running(); got != 1 {
			t.Fatalf("status %d: running %v while in flight, want 1", tc.status, got)
		}
		ex.ResponseStarted(ctx, server.ResponseHead{Status: tc.status})
		ex.ResponseChunk(ctx, []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":2}}`))
		ex.ResponseDone(ctx, server.ResponseSummary{Status: tc.status, Complete: true, UsageFound: true,
			Usage: openai.Usage{PromptTokens: 3, CompletionTokens: 2}})
		if got := running(); got != 0 {
			t.Fatalf("status %d: running %v after the end, want 0", tc.status, got)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got float64
		for _, mf := range mfs {
			if mf.GetName() != "llm_d_epp_request_error_total" {
				continue
			}
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "error_code" && l.GetValue() == "ModelServerError" {
						got += s.GetCounter().GetValue()
					}
				}
			}
		}
		if got != tc.wantErrors {
			t.Fatalf("after a %d: %v ModelServerError errors, want %v", tc.status, got, tc.wantErrors)
		}
	}
	// A request the picker refuses is an error, not a routed request.
	empty := liveDirector(t, pool{}, time.Now)
	empty.metrics = m
	if _, _, err := empty.HandleRequest(ctx, completion("no one to serve it", false)); err == nil {
		t.Fatal("routed without endpoints")
	}
	total, refused := 0.0, 0.0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			switch mf.GetName() {
			case "llm_d_epp_request_total":
				total += s.GetCounter().GetValue()
			case "llm_d_epp_request_error_total":
				for _, l := range s.GetLabel() {
					if l.GetName() == "error_code" && l.GetValue() == "ServiceUnavailable" {
						refused += s.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if total != 4 || refused != 1 {
		t.Errorf("request_total %v and ServiceUnavailable errors %v after 4 routed and 1 refused, want 4 and 1", total, refused)
	}
	if n, err := testutil.GatherAndCount(reg, "llm_d_epp_request_size_bytes", "llm_d_epp_response_size_bytes", "llm_d_epp_request_duration_seconds"); err != nil || n != 3 {
		t.Fatalf("size and duration series: %d (%v), want 3", n, err)
	}
}
