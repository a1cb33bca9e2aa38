package poll

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
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
	// After one failed round every endpoint with a document keeps its
	// data; one without (none) has nothing to keep.
	if len(r.kept) != 1 || len(r.kept[0]) != 4 || !r.kept[0]["addr-slow"] || r.kept[0]["addr-none"] {
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

// numbers is a Reader keeping each endpoint's document as a number in
// Values; a strict one cannot read anything else, a lenient one keeps -1.
type numbers struct {
	Values
	strict bool
}

func (n *numbers) Read(e *endpoints.Endpoint, doc []byte) error {
	v, err := strconv.ParseFloat(string(doc), 64)
	if err != nil {
		if n.strict {
			return err
		}
		v = -1
	}
	n.Set(e.Address(), map[string]float64{"v": v})
	return nil
}

// A reader keeps an endpoint's previous data through a failed round or
// two, never for good: after MaxFailedRounds rounds in a row without a
// document it could read, the data is dropped, and it returns with the
// next good document. An endpoint left with nothing to fetch (its node
// address gone) loses its data at once.
func TestRoundDropsStaleData(t *testing.T) {
	type reply struct {
		status int
		body   string
	}
	var mu sync.Mutex
	replies := map[string]reply{}
	urls := map[string]bool{}
	set := func(name string, status int, body string, url bool) {
		mu.Lock()
		defer mu.Unlock()
		replies[name], urls[name] = reply{status, body}, url
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		rp := replies[strings.TrimPrefix(r.URL.Path, "/")]
		mu.Unlock()
		w.WriteHeader(rp.status)
		_, _ = w.Write([]byte(rp.body))
	}))
	defer srv.Close()
	p := New("test", func(e *endpoints.Endpoint) string {
		mu.Lock()
		defer mu.Unlock()
		if !urls[e.Name()] {
			return ""
		}
		return srv.URL + "/" + e.Name()
	}, nil, nil)
	var eps []*endpoints.Endpoint
	for _, name := range []string{"up", "down", "garbled", "unplaced"} {
		eps = append(eps, endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: name + ":1"}))
	}
	strict, lenient := &numbers{strict: true}, &numbers{}
	readers := []Reader{strict, lenient}

	type want struct{ strict, lenient map[string]float64 }
	steps := []struct {
		name  string
		setup func()
		want  want
	}{
		{"all answer", func() {
			for _, n := range []string{"up", "down", "garbled", "unplaced"} {
				set(n, http.StatusOK, "1", true)
			}
		}, want{
			map[string]float64{"up:1": 1, "down:1": 1, "garbled:1": 1, "unplaced:1": 1},
			map[string]float64{"up:1": 1, "down:1": 1, "garbled:1": 1, "unplaced:1": 1},
		}},
		{"first failure", func() {
			set("up", http.StatusOK, "2", true)
			set("down", http.StatusServiceUnavailable, "", true)
			set("garbled", http.StatusOK, "garbage", true)
			set("unplaced", http.StatusOK, "2", false)
		}, want{
			map[string]float64{"up:1": 2, "down:1": 1, "garbled:1": 1},
			map[string]float64{"up:1": 2, "down:1": 1, "garbled:1": -1},
		}},
		{"second failure", func() {}, want{
			map[string]float64{"up:1": 2, "down:1": 1, "garbled:1": 1},
			map[string]float64{"up:1": 2, "down:1": 1, "garbled:1": -1},
		}},
		{"third failure drops", func() {}, want{
			map[string]float64{"up:1": 2},
			map[string]float64{"up:1": 2, "garbled:1": -1},
		}},
		{"back", func() {
			set("down", http.StatusOK, "5", true)
			set("garbled", http.StatusOK, "5", true)
		}, want{
			map[string]float64{"up:1": 2, "down:1": 5, "garbled:1": 5},
			map[string]float64{"up:1": 2, "down:1": 5, "garbled:1": 5},
		}},
		{"one failure after recovering is one", func() {
			set("down", http.StatusServiceUnavailable, "", true)
		}, want{
			map[string]float64{"up:1": 2, "down:1": 5, "garbled:1": 5},
			map[string]float64{"up:1": 2, "down:1": 5, "garbled:1": 5},
		}},
	}
	for _, st := range steps {
		st.setup()
		p.Round(context.Background(), eps, 5*time.Second, readers)
		for _, c := range []struct {
			name string
			s    *numbers
			want map[string]float64
		}{{"strict", strict, st.want.strict}, {"lenient", lenient, st.want.lenient}} {
			got := map[string]float64{}
			for _, e := range eps {
				if v, ok := c.s.Get(e.Address(), "v"); ok {
					got[e.Address()] = v
				}
			}
			if !maps.Equal(got, c.want) {
				t.Errorf("%s: %s reader holds %v, want %v", st.name, c.name, got, c.want)
			}
		}
	}
}
