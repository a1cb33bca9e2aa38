package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// testTimeout bounds every wait; nothing asserts how long anything takes.
const testTimeout = 20 * time.Second

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// leg is one request a recording server received.
type leg struct {
	Path   string
	Header http.Header
	Body   map[string]any
}

// recorder is a real HTTP server on loopback that keeps what it receives
// and answers with reply.
type recorder struct {
	srv   *httptest.Server
	mu    sync.Mutex
	legs  []leg
	reply func(w http.ResponseWriter, n int, l leg)
}

func newRecorder(t *testing.T, reply func(w http.ResponseWriter, n int, l leg)) *recorder {
	t.Helper()
	rec := &recorder{reply: reply}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		l := leg{Path: r.URL.Path, Header: r.Header.Clone()}
		_ = json.Unmarshal(raw, &l.Body)
		rec.mu.Lock()
		rec.legs = append(rec.legs, l)
		n := len(rec.legs)
		rec.mu.Unlock()
		rec.reply(w, n, l)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *recorder) addr() string { return r.srv.Listener.Addr().String() }

func (r *recorder) port() int { return r.srv.Listener.Addr().(*net.TCPAddr).Port }

func (r *recorder) got() []leg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]leg(nil), r.legs...)
}

func writeJSONReply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// poolFile writes a static endpoints file listing addrs.
func poolFile(t *testing.T, addrs ...string) string {
	t.Helper()
	specs := make([]endpoints.Spec, len(addrs))
	for i, a := range addrs {
		specs[i] = endpoints.Spec{Name: "pod-" + strconv.Itoa(i), Address: a}
	}
	b, err := staticfile.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// testOptions is a plain-HTTP sidecar on a free loopback port in front of
// modelPort, its pool the file (SSRF protection on) or none (off).
func testOptions(modelPort int, pool string) Options {
	o := DefaultOptions()
	o.Host, o.Port, o.ModelServerPort = "127.0.0.1", 0, modelPort
	o.SecureServing = false
	o.InferencePool = ""
	o.EndpointsFile = pool
	o.EnableSSRFProtection = pool != ""
	o.Logger = discard
	return o
}

// startSidecar runs a sidecar until the test ends and waits for its pool.
func startSidecar(t *testing.T, o Options) (*Server, string) {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if s.pool.enabled() {
		deadline := time.Now().Add(testTimeout)
		for !s.pool.loaded.Load() {
			if time.Now().After(deadline) {
				t.Fatal("pool not loaded")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return s, "http://" + s.Addr().String()
}

var (
	tokOnce sync.Once
	tokVal  *tokenizer.Tokenizer
	tokErr  error
)

func qwen3(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	dir := testutil.TokenizerDir(t)
	tokOnce.Do(func() { tokVal, tokErr = tokenizer.Load(dir) })
	if tokErr != nil {
		t.Fatalf("tokenizer: %v", tokErr)
	}
	return tokVal
}

// startSim runs an in-process `kvgate sim` of role on a free loopback port.
func startSim(t *testing.T, role vllmserver.Role) *vllmserver.Server {
	t.Helper()
	return startSimWith(t, role, nil)
}

// startSimWith is startSim with options changed by set first (nil: none).
func startSimWith(t *testing.T, role vllmserver.Role, set func(*vllmserver.Options)) *vllmserver.Server {
	t.Helper()
	o := vllmserver.DefaultOptions()
	o.Host, o.Port = "127.0.0.1", 0
	o.Tokenizer = qwen3(t)
	o.TimeScale = 50
	o.Role = role
	o.Logger = discard
	if set != nil {
		set(&o)
	}
	s, err := vllmserver.New(o)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s
}

func simAddr(s *vllmserver.Server) string { return s.Addr().String() }

func simPort(s *vllmserver.Server) int { return s.Addr().(*net.TCPAddr).Port }

// post sends body to url with headers and returns the status and answer.
func post(t *testing.T, url string, headers map[string]string, body any) (int, http.Header, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, raw
}
