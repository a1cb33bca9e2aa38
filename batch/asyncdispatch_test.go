package batch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/testutil/redistest"
)

// A line dispatched through AsyncDispatcher goes through a real
// redis-server and the real async processor to the gateway with the
// line's identity headers, and its answer comes back; a 4xx is an answer.
func TestAsyncDispatcherThroughTheProcessor(t *testing.T) {
	srv := redistest.Start(t)
	seen := make(chan http.Header, 4)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen <- r.Header.Clone()
		if r.URL.Path != "/v1/chat/completions" {
			http.Error(w, `{"error":"wrong path"}`, http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"echo":%s}`, body)
	}))
	defer gw.Close()
	cfg, err := async.ParseConfig([]byte(fmt.Sprintf(`{"url":"redis://%s/0","poll_interval_ms":20,"batch_size":10,
		"queues":[{"queue_name":"batch-queue","igw_base_url":%q}]}`, srv.Addr, gw.URL)), "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := async.New(async.Options{Config: cfg, Concurrency: 2, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processor: %v", err)
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	c := async.NewClient(rdb, async.ClientOptions{Queue: "batch-queue"})
	defer c.Close()
	d := &AsyncDispatcher{Client: c, Objective: "batch"}

	lctx, lcancel := context.WithTimeout(context.Background(), time.Minute)
	defer lcancel()
	resp, err := d.Do(lctx, &Request{RequestID: "batch_1-line-1", Tenant: "alice", URL: "/v1/chat/completions", Method: http.MethodPost,
		Body: []byte(`{"model":"m","messages":[]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || string(resp.Body) != `{"echo":{"model":"m","messages":[]}}` {
		t.Fatalf("answer %d %s", resp.StatusCode, resp.Body)
	}
	h := <-seen
	for k, want := range map[string]string{eppwire.HeaderObjective: "batch", eppwire.HeaderFairnessID: "alice", eppwire.HeaderRequestID: "batch_1-line-1"} {
		if got := h.Get(k); got != want {
			t.Errorf("gateway saw %s %q, want %q", k, got, want)
		}
	}
	resp, err = d.Do(lctx, &Request{RequestID: "batch_1-line-2", URL: "/v1/nope", Method: http.MethodPost, Body: []byte(`{}`)})
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("4xx: %v %+v", err, resp)
	}
}

// --async-queue replaces --gateway and needs a Redis.
func TestAsyncFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--async-queue", "q", "--redis-url", "redis://127.0.0.1:1/0"}, true},
		{[]string{"--async-queue", "q", "--async-redis-url", "redis://127.0.0.1:1/0"}, true},
		{[]string{"--async-queue", "q"}, false},
		{[]string{"--async-queue", "q", "--redis-url", "redis://x", "--gateway", "http://g"}, false},
		{[]string{"--async-redis-url", "redis://x", "--gateway", "http://g"}, false},
	} {
		_, err := ParseFlags(tc.args, io.Discard)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok=%v", tc.args, err, tc.ok)
		}
	}
}
