package sidecar

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// sseModelServer answers every POST the way vLLM and `kvgate sim` do for
// "stream": true: it reads the whole body, sends the headers at once, then
// the events a little later.
func sseModelServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		for i := range 3 {
			time.Sleep(time.Millisecond)
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\",\"finish_reason\":null}]}\n\n", i)
			_ = rc.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestPassthroughStreamsWholeBody is the regression for a local
// (non-P/D) request answered 200 with an empty body: the model server
// answered while the proxy's transport was still reading the request body
// to its end, writing the response header made the server close that body,
// the transport's read failed, and it closed the connection under the
// response. Every answer must arrive whole.
func TestPassthroughStreamsWholeBody(t *testing.T) {
	ms := sseModelServer(t)
	_, url := startSidecar(t, testOptions(ms.Listener.Addr().(*net.TCPAddr).Port, ""))
	body := []byte(`{"model":"m","stream":true,"max_tokens":3,"prompt":"` + strings.Repeat("lorem ipsum ", 250) + `"}`)
	const workers, each = 8, 150
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for range workers {
		wg.Go(func() {
			for range each {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					continue
				}
				raw, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					errs <- fmt.Errorf("status %d, body read after %d bytes: %v", resp.StatusCode, len(raw), err)
				case resp.StatusCode != http.StatusOK || !bytes.HasSuffix(raw, []byte("data: [DONE]\n\n")):
					errs <- fmt.Errorf("status %d, body %q", resp.StatusCode, raw)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n < 3 {
			t.Error(err)
		}
		n++
	}
	if n > 0 {
		t.Errorf("%d of %d requests failed", n, workers*each)
	}
}
