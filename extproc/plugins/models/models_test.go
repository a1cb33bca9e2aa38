package models

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/testutil"
)

const vllmList = `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B","object":"model","created":1700000000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B","parent":null,"max_model_len":8192},` +
	`{"id":"sql-lora","object":"model","owned_by":"vllm","parent":"meta-llama/Llama-3.1-8B"}]}`

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		ids        []string
		err        string
	}{
		{name: "vLLM's list with an adapter", body: vllmList, ids: []string{"meta-llama/Llama-3.1-8B", "sql-lora"}},
		{name: "empty list", body: `{"object":"list","data":[]}`},
		{name: "no data", body: `{"object":"list"}`, err: `no "data"`},
		{name: "entry without id", body: `{"data":[{"object":"model"}]}`, err: "data[0] has no id"},
		{name: "not JSON", body: `<html>`, err: "model list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := ParseList([]byte(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range ms {
				ids = append(ids, m.ID)
			}
			if strings.Join(ids, ",") != strings.Join(tc.ids, ",") {
				t.Fatalf("ids %v, want %v", ids, tc.ids)
			}
		})
	}
	ms, _ := ParseList([]byte(vllmList))
	if ms[1].Parent != "meta-llama/Llama-3.1-8B" || ms[0].OwnedBy != "vllm" || ms[0].Created != 1700000000 {
		t.Fatalf("fields %+v", ms)
	}
}

func source(t *testing.T, params string) *Source {
	t.Helper()
	p, err := NewSource("models", []byte(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Source)
}

func extractor(t *testing.T, src *Source) *Extractor {
	t.Helper()
	p, err := NewExtractor("x", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := p.(*Extractor)
	if err := x.AcceptsSource(src); err != nil {
		t.Fatal(err)
	}
	src.Connect(x)
	return x
}

func addr(srv *httptest.Server) string {
	return strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://")
}

// TestPoll: one poll loop over a live fleet: each endpoint's list lands in
// the extractor, a failing server keeps its last list, and an endpoint
// leaving the pool loses its list.
func TestPoll(t *testing.T) {
	before := runtime.NumGoroutine()
	var failing atomic.Bool
	var paths atomic.Value
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.URL.Path)
		_, _ = w.Write([]byte(vllmList))
	}))
	defer good.Close()
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m2"}]}`))
	}))
	defer flaky.Close()

	src := source(t, `{"path":"/v1/models","interval":"10ms"}`)
	x := extractor(t, src)
	ds := endpoints.NewDatastore()
	if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: addr(good)}, {Name: "b", Address: addr(flaky)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Poll(ctx, ds, 5*time.Millisecond) }()
	testutil.WaitFor(t, "both lists", func() bool {
		_, _, okA := x.Models(addr(good))
		_, _, okB := x.Models(addr(flaky))
		return okA && okB
	})
	if ms, _, _ := x.Models(addr(good)); len(ms) != 2 || ms[1].ID != "sql-lora" || paths.Load() != "/v1/models" {
		t.Fatalf("good: %+v at %v", ms, paths.Load())
	}
	// A server that keeps failing loses its list (after
	// poll.MaxFailedRounds rounds: a single failure keeps it, which
	// extproc/endpoints/poll tests), and gets it back when it answers.
	failing.Store(true)
	testutil.WaitFor(t, "the failing server's list dropped", func() bool {
		_, _, ok := x.Models(addr(flaky))
		return !ok
	})
	if _, _, ok := x.Models(addr(good)); !ok {
		t.Fatal("the healthy server's list went with the failing one's")
	}
	failing.Store(false)
	testutil.WaitFor(t, "the recovered server's list", func() bool {
		ms, _, ok := x.Models(addr(flaky))
		return ok && len(ms) == 1 && ms[0].ID == "m2"
	})
	if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: addr(good)}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the removed endpoint's list dropped", func() bool {
		_, _, ok := x.Models(addr(flaky))
		return !ok
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	good.Close()
	flaky.Close()
	testutil.NoGoroutineLeak(t, before, "models poll")
}

// TestHTTPS: scheme https verifies the server with caCertPath when
// insecureSkipVerify is false, and refuses an unknown certificate.
func TestHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(vllmList)) }))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		params string
		ok     bool
	}{
		{`{"scheme":"https","insecureSkipVerify":false,"caCertPath":"` + ca + `"}`, true},
		{`{"scheme":"https"}`, true}, // llm-d's default skips verification
		{`{"scheme":"https","insecureSkipVerify":false}`, false},
		{`{"scheme":"http"}`, false},
	} {
		// httptest's certificate names 127.0.0.1 and example.com.
		_, err := source(t, tc.params).Fetch(t.Context(), addr(srv))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v", tc.params, err)
		}
	}
}

func TestParams(t *testing.T) {
	if s := source(t, `{}`); s.URL("10.0.0.1:8000") != "http://10.0.0.1:8000/v1/models" {
		t.Fatalf("default URL %s", s.URL("10.0.0.1:8000"))
	}
	for params, want := range map[string]string{
		`{"scheme":"grpc"}`:                    "want http or https",
		`{"path":"v1/models"}`:                 "must start with /",
		`{"interval":"-1s"}`:                   "must not be negative",
		`{"clientCertPath":"/x"}`:              "set together",
		`{"caCertPath":"/nonexistent/ca.pem"}`: "caCertPath",
		`{"port":9400}`:                        "unknown field",
	} {
		if _, err := NewSource("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
	if _, err := NewExtractor("", json.RawMessage(`{"a":1}`), nil); err == nil {
		t.Error("extractor accepted parameters")
	}
	other := otherSource{scheduling.NewNamed("metrics-data-source", "m")}
	p, _ := NewExtractor("", nil, nil)
	if err := p.(*Extractor).AcceptsSource(other); err == nil || !strings.Contains(err.Error(), SourceType) {
		t.Errorf("extractor accepted a %s: %v", other.TypedName().Type, err)
	}
}

type otherSource struct{ scheduling.Named }

func (otherSource) DataLayerSource() {}

func FuzzParseList(f *testing.F) {
	f.Add([]byte(vllmList))
	f.Add([]byte(`{"data":[{"id":""}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, err := ParseList(data)
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.ID == "" {
				t.Fatal("accepted a model without an id")
			}
		}
	})
}
