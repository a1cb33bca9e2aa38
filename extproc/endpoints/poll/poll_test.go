package poll

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// recorder is a Reader keeping what it was handed.
type recorder struct {
	mu   sync.Mutex
	docs map[string]string
	kept []map[string]bool
	err  error
}

func (r *recorder) Read(e *endpoints.Endpoint, doc []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.docs[e.Name()] = string(doc)
	return r.err
}

func (r *recorder) Keep(present map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kept = append(r.kept, present)
}

func TestRound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte("doc"))
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", MaxBytes+1)))
		case "/slow":
			// Answers never: only the round's timeout ends the fetch.
			<-r.Context().Done()
		default:
			http.Error(w, "no", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	paths := map[string]string{"ok": "/ok", "big": "/big", "missing": "/missing", "slow": "/slow", "none": ""}
	p := New("test", func(e *endpoints.Endpoint) string {
		if paths[e.Name()] == "" {
			return "" // nothing to fetch for this endpoint
		}
		return srv.URL + paths[e.Name()]
	}, nil, nil)
	var eps []*endpoints.Endpoint
	for name := range paths {
		eps = append(eps, endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: "addr-" + name}))
	}
	r := &recorder{docs: map[string]string{}, err: errors.New("reader error is logged")}
	p.Round(context.Background(), eps, 200*time.Millisecond, []Reader{r})
	if len(r.docs) != 1 || r.docs["ok"] != "doc" {
		t.Fatalf("documents %v: only the 200 within MaxBytes must be read", r.docs)
	}
	if len(r.kept) != 1 || len(r.kept[0]) != 5 || !r.kept[0]["addr-slow"] || !r.kept[0]["addr-none"] {
		t.Fatalf("Keep got %v", r.kept)
	}
	for path, want := range map[string]string{"/big": "larger than", "/missing": "404"} {
		if _, err := p.Fetch(context.Background(), srv.URL+path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", path, err, want)
		}
	}
	p.CloseIdleConnections()
}

func TestRunNeedsInterval(t *testing.T) {
	p := New("test", func(*endpoints.Endpoint) string { return "" }, nil, nil)
	if err := p.Run(context.Background(), endpoints.NewDatastore(), 0, nil); err == nil {
		t.Fatal("ran without an interval")
	}
}
