package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// harness is an in-process `kvgate batch` (API + processor) on loopback in
// front of a gateway handler.
type harness struct {
	t     *testing.T
	api   *httptest.Server
	store Store
	blobs *Blobs
	proc  *Processor
}

func newHarness(t *testing.T, s Store, gw http.Handler, tweak func(*ProcessorConfig)) *harness {
	t.Helper()
	dir := t.TempDir()
	blobs, err := newBlobs(filepath.Join(dir, "files"))
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := httptest.NewServer(gw)
	t.Cleanup(gwSrv.Close)
	c := ProcessorConfig{Store: s, Blobs: blobs, JournalDir: filepath.Join(dir, "journals"), Owner: "test",
		Dispatcher: &HTTPDispatcher{Base: gwSrv.URL, Objective: "batch"}, LeaseTTL: time.Second, Jobs: 2,
		MaxConcurrency: 8, MaxModelConcurrency: 4, MaxLines: 1000, MaxAttempts: 4,
		RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond, Poll: 20 * time.Millisecond}
	if tweak != nil {
		tweak(&c)
	}
	p, err := NewProcessor(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	api := httptest.NewServer(NewServer(ServerConfig{Store: s, Blobs: blobs, TenantHeader: "X-MaaS-Username", MaxFileBytes: 1 << 20}))
	t.Cleanup(api.Close)
	return &harness{t: t, api: api, store: s, blobs: blobs, proc: p}
}

// do sends a request as tenant and decodes the JSON answer into out.
func (h *harness) do(method, path, tenant string, body io.Reader, ctype string, out any) int {
	h.t.Helper()
	req, _ := http.NewRequest(method, h.api.URL+path, body)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if tenant != "" {
		req.Header.Set("X-MaaS-Username", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			h.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode
}

func (h *harness) upload(tenant, purpose, name, content string) (File, int, map[string]*apiError) {
	h.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if purpose != "" {
		mw.WriteField("purpose", purpose)
	}
	fw, _ := mw.CreateFormFile("file", name)
	fw.Write([]byte(content))
	mw.Close()
	var raw json.RawMessage
	code := h.do(http.MethodPost, "/v1/files", tenant, &buf, mw.FormDataContentType(), &raw)
	var f File
	var e map[string]*apiError
	json.Unmarshal(raw, &f)
	json.Unmarshal(raw, &e)
	return f, code, e
}

func (h *harness) createBatch(tenant string, req map[string]any) (Batch, int, map[string]*apiError) {
	h.t.Helper()
	js, _ := json.Marshal(req)
	var raw json.RawMessage
	code := h.do(http.MethodPost, "/v1/batches", tenant, bytes.NewReader(js), "application/json", &raw)
	var b Batch
	var e map[string]*apiError
	json.Unmarshal(raw, &b)
	json.Unmarshal(raw, &e)
	return b, code, e
}

func (h *harness) wait(tenant, id string) Batch {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var b Batch
		h.do(http.MethodGet, "/v1/batches/"+id, tenant, nil, "", &b)
		if final(b.Status) {
			return b
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("batch %s still %s", id, b.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// completedJobs waits until jobs_processed_total{completed} reaches want
// and returns it: a batch's final status is written before the counter
// moves, so a test that has seen the status may still read the old count.
func (h *harness) completedJobs(want float64) float64 {
	h.t.Helper()
	c := h.proc.m.jobs.WithLabelValues(StatusCompleted)
	testutil.WaitFor(h.t, fmt.Sprintf("jobs_processed_total{completed} %v", want), func() bool { return promtest.ToFloat64(c) >= want })
	return promtest.ToFloat64(c)
}

func (h *harness) content(tenant string, id *string) []outputLine {
	h.t.Helper()
	if id == nil {
		return nil
	}
	req, _ := http.NewRequest(http.MethodGet, h.api.URL+"/v1/files/"+*id+"/content", nil)
	req.Header.Set("X-MaaS-Username", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []outputLine
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var l outputLine
		if err := dec.Decode(&l); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// chatGateway answers chat requests as a model server would, with usage;
// a prompt "status N" answers N instead.
func chatGateway(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model    string
			Messages []struct{ Content string }
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Messages) == 0 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		prompt := body.Messages[0].Content
		var status int
		if _, err := fmt.Sscanf(prompt, "status %d", &status); err == nil {
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":{"message":"status %d","type":"x","param":null,"code":null}}`, status)
			return
		}
		w.Header().Set(eppwire.HeaderRequestID, r.Header.Get(eppwire.HeaderRequestID))
		fmt.Fprintf(w, `{"object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}}`, body.Model, prompt)
	})
}

func chatInput(prompts ...string) string {
	var b strings.Builder
	for i, p := range prompts {
		fmt.Fprintf(&b, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":%q}]}}`+"\n", i, p)
	}
	return b.String()
}

func TestBatchLifecycle(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		h := newHarness(t, s, chatGateway(t), nil)
		f, code, _ := h.upload("ten", PurposeBatch, "in.jsonl", chatInput("a", "b", "status 400", "c"))
		if code != 200 || !strings.HasPrefix(f.ID, "file-") || f.Object != "file" || f.Bytes == 0 || f.Filename != "in.jsonl" || f.Status != "processed" {
			t.Fatalf("upload: %d %+v", code, f)
		}
		b, code, _ := h.createBatch("ten", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h",
			"metadata": map[string]string{"k": "v"}, "output_expires_after": map[string]any{"anchor": "created_at", "seconds": 3600}})
		if code != 200 || b.Status != StatusValidating || b.Object != "batch" || b.ExpiresAt == nil || *b.ExpiresAt != b.CreatedAt+86400 {
			t.Fatalf("create: %d %+v", code, b)
		}
		b = h.wait("ten", b.ID)
		if b.Status != StatusCompleted || b.RequestCounts != (RequestCounts{Total: 4, Completed: 3, Failed: 1}) ||
			b.Metadata["k"] != "v" || b.Model == nil || *b.Model != "m" {
			t.Fatalf("done: %+v", b)
		}
		if b.Usage.InputTokens != 30 || b.Usage.OutputTokens != 9 || b.Usage.TotalTokens != 39 || b.Usage.InputTokensDetails.CachedTokens != 12 {
			t.Errorf("usage %+v", b.Usage)
		}
		out, errs := h.content("ten", b.OutputFileID), h.content("ten", b.ErrorFileID)
		if len(out) != 3 || len(errs) != 1 {
			t.Fatalf("%d output lines, %d error lines", len(out), len(errs))
		}
		for _, l := range out {
			if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || !strings.HasPrefix(l.ID, "batch_req_") || l.Response.RequestID != l.ID {
				t.Errorf("output line %+v", l)
			}
		}
		if e := errs[0]; e.CustomID != "c2" || e.Response == nil || e.Response.StatusCode != 400 || e.Error != nil ||
			!strings.Contains(string(e.Response.Body), "status 400") {
			t.Errorf("error line %+v", e)
		}
		var of File
		h.do(http.MethodGet, "/v1/files/"+*b.OutputFileID, "ten", nil, "", &of)
		if of.Purpose != PurposeBatchOutput || of.ExpiresAt == nil || *of.ExpiresAt != of.CreatedAt+3600 {
			t.Errorf("output file %+v", of)
		}
		// Another tenant sees none of it.
		var e map[string]*apiError
		if code := h.do(http.MethodGet, "/v1/batches/"+b.ID, "other", nil, "", &e); code != 404 || e["error"].Type != "invalid_request_error" {
			t.Errorf("other tenant: %d %+v", code, e["error"])
		}
		if code := h.do(http.MethodGet, "/v1/files/"+f.ID+"/content", "", nil, "", &e); code != 404 {
			t.Errorf("no tenant: %d", code)
		}
		// An ended batch cannot be cancelled; its input can now be deleted.
		if code := h.do(http.MethodPost, "/v1/batches/"+b.ID+"/cancel", "ten", nil, "", &e); code != 409 || !strings.Contains(e["error"].Message, "completed") {
			t.Errorf("cancel completed: %d %+v", code, e["error"])
		}
		var del struct {
			ID      string
			Object  string
			Deleted bool
		}
		if code := h.do(http.MethodDelete, "/v1/files/"+f.ID, "ten", nil, "", &del); code != 200 || !del.Deleted || del.ID != f.ID || del.Object != "file" {
			t.Errorf("delete: %d %+v", code, del)
		}
		if code := h.do(http.MethodGet, "/v1/files/"+f.ID, "ten", nil, "", &e); code != 404 {
			t.Errorf("deleted file: %d", code)
		}
	})
}

// TestValidationFailure: a bad input file fails the batch with one error
// per bad line, numbered, and no result files.
func TestValidationFailure(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		h := newHarness(t, s, chatGateway(t), nil)
		in := chatInput("a") + "{oops\n" + `{"custom_id":"c0","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}` + "\n" +
			`{"custom_id":"z","method":"POST","url":"/v1/completions","body":{"model":"m"}}` + "\n"
		f, _, _ := h.upload("", PurposeBatch, "in.jsonl", in)
		b, _, _ := h.createBatch("", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "1h"})
		b = h.wait("", b.ID)
		if b.Status != StatusFailed || b.FailedAt == nil || b.InProgressAt != nil || b.OutputFileID != nil || b.ErrorFileID != nil || b.Errors == nil {
			t.Fatalf("%+v", b)
		}
		var got []string
		for _, e := range b.Errors.Data {
			got = append(got, fmt.Sprintf("%s@%d", e.Code, *e.Line))
		}
		if want := []string{"invalid_json_line@2", "duplicate_custom_id@3", "invalid_url@4"}; fmt.Sprint(got) != fmt.Sprint(want) || b.Errors.Object != "list" {
			t.Errorf("errors %v, want %v", got, want)
		}
	})
}

func TestRequestErrors(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		h := newHarness(t, s, chatGateway(t), nil)
		in, _, _ := h.upload("", PurposeBatch, "in.jsonl", chatInput("a"))
		other, _, _ := h.upload("", "user_data", "x.txt", "hello")
		if _, code, e := h.upload("", "", "in.jsonl", "x"); code != 400 || *e["error"].Param != "purpose" {
			t.Errorf("no purpose: %d %+v", code, e["error"])
		}
		if _, code, e := h.upload("", "nonsense", "in.jsonl", "x"); code != 400 || *e["error"].Param != "purpose" {
			t.Errorf("bad purpose: %d %+v", code, e["error"])
		}
		if _, code, e := h.upload("", PurposeBatch, "big.jsonl", strings.Repeat("x", 1<<20+1)); code != 400 || *e["error"].Code != "file_too_large" {
			t.Errorf("too large: %d %+v", code, e["error"])
		}
		for _, tc := range []struct {
			req    map[string]any
			status int
			param  string
		}{
			{map[string]any{"endpoint": chatURL, "completion_window": "24h"}, 400, "input_file_id"},
			{map[string]any{"input_file_id": in.ID, "completion_window": "24h"}, 400, "endpoint"},
			{map[string]any{"input_file_id": in.ID, "endpoint": "/v1/images", "completion_window": "24h"}, 400, "endpoint"},
			{map[string]any{"input_file_id": in.ID, "endpoint": chatURL}, 400, "completion_window"},
			{map[string]any{"input_file_id": in.ID, "endpoint": chatURL, "completion_window": "one day"}, 400, "completion_window"},
			{map[string]any{"input_file_id": in.ID, "endpoint": chatURL, "completion_window": "24h",
				"output_expires_after": map[string]any{"anchor": "created_at", "seconds": 60}}, 400, "output_expires_after.seconds"},
			{map[string]any{"input_file_id": in.ID, "endpoint": chatURL, "completion_window": "24h",
				"output_expires_after": map[string]any{"anchor": "now", "seconds": 3600}}, 400, "output_expires_after.anchor"},
			{map[string]any{"input_file_id": "file-nope", "endpoint": chatURL, "completion_window": "24h"}, 404, "input_file_id"},
			{map[string]any{"input_file_id": other.ID, "endpoint": chatURL, "completion_window": "24h"}, 400, "input_file_id"},
		} {
			_, code, e := h.createBatch("", tc.req)
			if code != tc.status || e["error"] == nil || e["error"].Param == nil || *e["error"].Param != tc.param || e["error"].Type != "invalid_request_error" || e["error"].Message == "" {
				t.Errorf("%v: %d %+v, want %d param %s", tc.req, code, e["error"], tc.status, tc.param)
			}
		}
		var e map[string]*apiError
		if code := h.do(http.MethodGet, "/v1/nothing", "", nil, "", &e); code != 404 || e["error"] == nil {
			t.Errorf("unknown path: %d", code)
		}
		// The error envelope has OpenAI's four fields, nulls included.
		var raw map[string]map[string]any
		h.do(http.MethodGet, "/v1/batches/batch_nope", "", nil, "", &raw)
		for _, k := range []string{"message", "type", "param", "code"} {
			if _, ok := raw["error"][k]; !ok {
				t.Errorf("error lacks %q: %v", k, raw)
			}
		}
	})
}

func TestPagination(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		h := newHarness(t, s, chatGateway(t), nil)
		var ids []string
		for i := range 5 {
			f, _, _ := h.upload("p", PurposeBatch, fmt.Sprintf("%d.jsonl", i), chatInput("a"))
			ids = append(ids, f.ID)
		}
		h.upload("p", "user_data", "u", "x")
		h.upload("q", PurposeBatch, "other tenant", chatInput("a"))
		var page list[File]
		h.do(http.MethodGet, "/v1/files?purpose=batch&limit=2", "p", nil, "", &page)
		if page.Object != "list" || len(page.Data) != 2 || !page.HasMore || page.Data[0].ID != ids[4] || *page.LastID != ids[3] {
			t.Fatalf("first page %+v", page)
		}
		h.do(http.MethodGet, "/v1/files?purpose=batch&limit=2&after="+*page.LastID, "p", nil, "", &page)
		if len(page.Data) != 2 || !page.HasMore || page.Data[0].ID != ids[2] {
			t.Fatalf("second page %+v", page)
		}
		h.do(http.MethodGet, "/v1/files?purpose=batch&limit=2&after="+*page.LastID, "p", nil, "", &page)
		if len(page.Data) != 1 || page.HasMore || page.Data[0].ID != ids[0] {
			t.Fatalf("last page %+v", page)
		}
		h.do(http.MethodGet, "/v1/files?order=asc&limit=1", "p", nil, "", &page)
		if page.Data[0].ID != ids[0] || !page.HasMore {
			t.Errorf("asc %+v", page)
		}
		var e map[string]*apiError
		if code := h.do(http.MethodGet, "/v1/files?limit=0", "p", nil, "", &e); code != 400 || *e["error"].Param != "limit" {
			t.Errorf("limit 0: %d", code)
		}
		var bids []string
		for range 3 {
			b, _, _ := h.createBatch("p", map[string]any{"input_file_id": ids[0], "endpoint": chatURL, "completion_window": "24h"})
			bids = append(bids, b.ID)
		}
		var bp list[Batch]
		h.do(http.MethodGet, "/v1/batches?limit=2", "p", nil, "", &bp)
		if len(bp.Data) != 2 || !bp.HasMore || bp.Data[0].ID != bids[2] || *bp.FirstID != bids[2] {
			t.Fatalf("batches %+v", bp)
		}
		h.do(http.MethodGet, "/v1/batches?after="+*bp.LastID, "p", nil, "", &bp)
		if len(bp.Data) != 1 || bp.HasMore || bp.Data[0].ID != bids[0] {
			t.Errorf("batches after %+v", bp)
		}
		h.do(http.MethodGet, "/v1/batches", "q", nil, "", &bp)
		if len(bp.Data) != 0 || bp.FirstID != nil || bp.Data == nil {
			t.Errorf("other tenant's batches %+v", bp)
		}
	})
}

// TestRetriesAndLimits: 429 and 503 are retried with backoff until an
// answer; one that keeps refusing ends as its last answer; requests are
// grouped by model within the global and per-model limits and carry the
// batch's flow-control headers.
func TestRetriesAndLimits(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		var (
			mu                 sync.Mutex
			inflight, maxTotal int
			perModel           = map[string]int{}
			maxModel           = map[string]int{}
			tries              = map[string]int{} // by request id
			prompts            = map[string]string{}
			badHeaders         atomic.Int32
		)
		gw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var body struct {
				Model    string
				Messages []struct{ Content string }
			}
			json.NewDecoder(r.Body).Decode(&body)
			if r.Header.Get(eppwire.HeaderObjective) != "batch" || r.Header.Get(eppwire.HeaderFairnessID) != "ten" || r.Header.Get(eppwire.HeaderRequestID) == "" {
				badHeaders.Add(1)
			}
			prompt := body.Messages[0].Content
			mu.Lock()
			inflight++
			perModel[body.Model]++
			maxTotal = max(maxTotal, inflight)
			maxModel[body.Model] = max(maxModel[body.Model], perModel[body.Model])
			rid := r.Header.Get(eppwire.HeaderRequestID)
			tries[rid]++
			prompts[rid] = prompt
			n := tries[rid]
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			inflight--
			perModel[body.Model]--
			mu.Unlock()
			switch {
			case strings.HasPrefix(prompt, "flaky") && n <= 2:
				w.Header().Set(eppwire.HeaderDroppedReason, eppwire.DroppedSaturated)
				w.WriteHeader([]int{429, 503}[n-1])
				return
			case strings.HasPrefix(prompt, "always"):
				w.WriteHeader(503)
				return
			}
			fmt.Fprintf(w, `{"choices":[{"message":{"content":%q}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, prompt)
		})
		h := newHarness(t, s, gw, func(c *ProcessorConfig) { c.MaxConcurrency, c.MaxModelConcurrency, c.MaxAttempts = 5, 3, 3 })
		var in strings.Builder
		for i := range 60 {
			prompt := fmt.Sprintf("ok %d", i)
			switch i % 20 {
			case 1:
				prompt = fmt.Sprintf("flaky %d", i)
			case 2:
				prompt = fmt.Sprintf("always %d", i)
			}
			fmt.Fprintf(&in, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m%d","messages":[{"role":"user","content":%q}]}}`+"\n", i, i%3, prompt)
		}
		// Two batches at once (Jobs 2): the limits hold over both.
		f, _, _ := h.upload("ten", PurposeBatch, "in.jsonl", in.String())
		var ids []string
		for range 2 {
			b, _, _ := h.createBatch("ten", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h"})
			ids = append(ids, b.ID)
		}
		for _, id := range ids {
			b := h.wait("ten", id)
			if b.Status != StatusCompleted || b.RequestCounts != (RequestCounts{Total: 60, Completed: 57, Failed: 3}) || b.Model != nil {
				t.Fatalf("%+v", b)
			}
			for _, l := range h.content("ten", b.ErrorFileID) {
				if l.Response == nil || l.Response.StatusCode != 503 {
					t.Errorf("error line %+v", l)
				}
			}
		}
		m := h.proc.m
		errsByModel := 0.0
		for _, model := range []string{"m0", "m1", "m2"} {
			errsByModel += promtest.ToFloat64(m.modelErrors.WithLabelValues(model))
		}
		if got := h.completedJobs(2); got != 2 {
			t.Errorf("jobs_processed_total{completed} = %v", got)
		}
		// Per batch: 3 flaky lines refused twice, 3 always-503 lines tried 3 times.
		if got := promtest.ToFloat64(m.retries); got != 24 {
			t.Errorf("retries %v, want 24", got)
		}
		if errsByModel != 6 || promtest.ToFloat64(m.inflight) != 0 || promtest.ToFloat64(m.maxInflight) != 5 {
			t.Errorf("errors by model %v, in flight %v, max %v", errsByModel, promtest.ToFloat64(m.inflight), promtest.ToFloat64(m.maxInflight))
		}
		mu.Lock()
		defer mu.Unlock()
		if len(tries) != 120 {
			t.Errorf("%d request ids, want 120", len(tries))
		}
		for rid, n := range tries {
			p := prompts[rid]
			want := 1
			switch {
			case strings.HasPrefix(p, "flaky"):
				want = 3
			case strings.HasPrefix(p, "always"):
				want = 3 // MaxAttempts
			}
			if n != want {
				t.Errorf("%q tried %d times, want %d", p, n, want)
			}
		}
		if maxTotal > 5 || len(maxModel) != 3 {
			t.Errorf("in flight at most %d (limit 5); models %v", maxTotal, maxModel)
		}
		for m, n := range maxModel {
			if n > 3 {
				t.Errorf("model %s: %d in flight (limit 3)", m, n)
			}
		}
		if badHeaders.Load() != 0 {
			t.Errorf("%d requests without the objective, fairness id or request id", badHeaders.Load())
		}
	})
}

func TestDeleteInputOfActiveBatch(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		block := make(chan struct{})
		gw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-block
			w.Write([]byte(`{}`))
		})
		h := newHarness(t, s, gw, nil)
		t.Cleanup(func() { close(block) })
		f, _, _ := h.upload("", PurposeBatch, "in.jsonl", chatInput("a"))
		b, _, _ := h.createBatch("", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h"})
		var e map[string]*apiError
		if code := h.do(http.MethodDelete, "/v1/files/"+f.ID, "", nil, "", &e); code != 409 || !strings.Contains(e["error"].Message, b.ID) {
			t.Errorf("delete input of a running batch: %d %+v", code, e["error"])
		}
	})
}

func TestExpiredFilesAreDeleted(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		h := newHarness(t, s, chatGateway(t), nil)
		f, _, _ := h.upload("", "user_data", "x", "content")
		rec, _ := s.GetFile(t.Context(), f.ID)
		rec.ExpiresAt = ptr(time.Now().Unix() - 1)
		if err := s.PutFile(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
		if err := h.proc.expireFiles(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetFile(t.Context(), f.ID); err == nil {
			t.Error("expired file still listed")
		}
		if _, err := h.blobs.Open(f.ID); err == nil {
			t.Error("expired file's content still there")
		}
	})
}

func TestBackoff(t *testing.T) {
	half := func(n int64) int64 { return n / 2 }
	for _, tc := range []struct {
		n    int
		ra   string
		want time.Duration
	}{
		{1, "", 75 * time.Millisecond},   // 100ms: 50 + 25
		{2, "", 150 * time.Millisecond},  // 200ms
		{30, "", 750 * time.Millisecond}, // capped at 1s
		{1, "0.5", 500 * time.Millisecond},
		{1, "9", time.Second}, // Retry-After capped too
		{1, "junk", 75 * time.Millisecond},
	} {
		if got := backoff(tc.n, 100*time.Millisecond, time.Second, tc.ra, half); got != tc.want {
			t.Errorf("backoff(%d, %q) = %v, want %v", tc.n, tc.ra, got, tc.want)
		}
	}
}

func TestStaleJournalsAreRemoved(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		h := newHarness(t, s, chatGateway(t), nil)
		ended := BatchRecord{Batch: Batch{ID: newID("batch_", 8), Status: StatusCompleted}}
		running := BatchRecord{Batch: Batch{ID: newID("batch_", 8), Status: StatusCancelling, ExpiresAt: ptr(time.Now().Add(time.Hour).Unix())}}
		// Hold the running batch's lease, before the batch exists, so that
		// the processor (whose sweep re-queues active batches) leaves it be.
		if ok, _ := s.Lease(t.Context(), running.ID, "someone", time.Minute); !ok {
			t.Fatal("lease")
		}
		for _, b := range []BatchRecord{ended, running} {
			if err := s.CreateBatch(t.Context(), b); err != nil {
				t.Fatal(err)
			}
		}
		dir := h.proc.c.JournalDir
		for _, name := range []string{ended.ID, running.ID, "batch_gone"} {
			if err := os.WriteFile(filepath.Join(dir, name+journalSuffix), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.proc.removeStaleJournals(t.Context()); err != nil {
			t.Fatal(err)
		}
		left, _ := os.ReadDir(dir)
		if len(left) != 1 || left[0].Name() != running.ID+journalSuffix {
			t.Errorf("journals left: %v", left)
		}
	})
}

// failFinal fails the first update that would end a batch, as a crash
// between writing the result files and recording the end would.
type failFinal struct {
	Store
	failed atomic.Bool
}

var errInjected = errors.New("injected failure")

func (s *failFinal) UpdateBatch(ctx context.Context, id string, fn func(*BatchRecord) error) (BatchRecord, error) {
	return s.Store.UpdateBatch(ctx, id, func(r *BatchRecord) error {
		if err := fn(r); err != nil {
			return err
		}
		if final(r.Status) && r.Status != StatusFailed && s.failed.CompareAndSwap(false, true) {
			return errInjected
		}
		return nil
	})
}

// TestFinalisationRepeats: a finalisation cut short is done again by the
// next attempt, into the same files, each line once.
func TestFinalisationRepeats(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		fs := &failFinal{Store: s}
		h := newHarness(t, fs, chatGateway(t), nil)
		f, _, _ := h.upload("", PurposeBatch, "in.jsonl", chatInput("a", "b", "status 500", "c"))
		b, _, _ := h.createBatch("", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h"})
		b = h.wait("", b.ID)
		if !fs.failed.Load() {
			t.Fatal("the failure was not injected")
		}
		if b.Status != StatusCompleted || b.RequestCounts != (RequestCounts{Total: 4, Completed: 3, Failed: 1}) {
			t.Fatalf("%+v", b)
		}
		if *b.OutputFileID != resultFileID(b.ID, "output") || *b.ErrorFileID != resultFileID(b.ID, "error") {
			t.Errorf("result files %s %s", *b.OutputFileID, *b.ErrorFileID)
		}
		seen := map[string]int{}
		for _, l := range append(h.content("", b.OutputFileID), h.content("", b.ErrorFileID)...) {
			seen[l.CustomID]++
		}
		if len(seen) != 4 {
			t.Errorf("results %v", seen)
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("%s: %d results", id, n)
			}
		}
		var files list[File]
		h.do(http.MethodGet, "/v1/files?purpose=batch_output", "", nil, "", &files)
		if len(files.Data) != 2 {
			t.Errorf("%d result files, want 2", len(files.Data))
		}
	})
}

// TestCancelLetsInFlightFinish: cancel stops dispatch; the request in
// flight finishes and is kept, the others get batch_cancelled.
func TestCancelLetsInFlightFinish(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		arrived, release := make(chan struct{}, 10), make(chan struct{})
		inner := chatGateway(t)
		gw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			<-release
			inner.ServeHTTP(w, r)
		})
		seen := &seesCancel{Store: s, saw: make(chan struct{})}
		h := newHarness(t, seen, gw, func(c *ProcessorConfig) { c.MaxModelConcurrency = 1 })
		f, _, _ := h.upload("", PurposeBatch, "in.jsonl", chatInput("a", "b", "c", "d"))
		b, _, _ := h.createBatch("", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h"})
		<-arrived
		var c Batch
		if code := h.do(http.MethodPost, "/v1/batches/"+b.ID+"/cancel", "", nil, "", &c); code != 200 || c.Status != StatusCancelling || c.CancellingAt == nil {
			t.Fatalf("cancel: %d %+v", code, c)
		}
		<-seen.saw // the processor has read the cancel
		close(release)
		b = h.wait("", b.ID)
		if b.Status != StatusCancelled || b.CancelledAt == nil || b.RequestCounts != (RequestCounts{Total: 4, Completed: 1, Failed: 3}) {
			t.Fatalf("%+v", b)
		}
		out, errs := h.content("", b.OutputFileID), h.content("", b.ErrorFileID)
		if len(out) != 1 || out[0].CustomID != "c0" || len(errs) != 3 {
			t.Fatalf("output %+v errors %+v", out, errs)
		}
		for _, l := range errs {
			if l.Response != nil || l.Error == nil || l.Error.Code != CodeCancelled {
				t.Errorf("error line %+v", l)
			}
		}
		if n := len(arrived); n != 0 {
			t.Errorf("%d requests sent after the cancel", n)
		}
	})
}

// seesCancel reports the first read of a cancelling batch: after the
// cancel call, only the processor reads the batch.
type seesCancel struct {
	Store
	once sync.Once
	saw  chan struct{}
}

func (s *seesCancel) GetBatch(ctx context.Context, id string) (BatchRecord, error) {
	b, err := s.Store.GetBatch(ctx, id)
	if err == nil && b.Status == StatusCancelling {
		s.once.Do(func() { close(s.saw) })
	}
	return b, err
}

// sweepFirst removes the journal as the final status is written, as the
// processor's own stale-journal sweep may when it runs at that moment.
type sweepFirst struct {
	Store
	dir     string
	removed atomic.Bool
}

func (s *sweepFirst) UpdateBatch(ctx context.Context, id string, fn func(*BatchRecord) error) (BatchRecord, error) {
	r, err := s.Store.UpdateBatch(ctx, id, fn)
	if err == nil && final(r.Status) {
		// The processor's own sweep may have been first: gone either way.
		if err := os.Remove(filepath.Join(s.dir, id+journalSuffix)); err == nil || errors.Is(err, os.ErrNotExist) {
			s.removed.Store(true)
		}
	}
	return r, err
}

// TestJournalSweptBeforeRemoval: the sweep removing a finished batch's
// journal first is no error; the job counts once as completed (it was
// counted twice, and logged as failed, when its own removal then failed).
func TestJournalSweptBeforeRemoval(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		sw := &sweepFirst{Store: s}
		var logged testutil.SyncBuffer
		h := newHarness(t, sw, chatGateway(t), func(c *ProcessorConfig) {
			sw.dir = c.JournalDir
			c.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelError}))
		})
		f, _, _ := h.upload("", PurposeBatch, "in.jsonl", chatInput("a", "b"))
		b, _, _ := h.createBatch("", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h"})
		if b = h.wait("", b.ID); b.Status != StatusCompleted {
			t.Fatalf("%+v", b)
		}
		// The wrapper removes the journal after the store's update, which
		// the API can already report as completed.
		testutil.WaitFor(t, "the journal swept first", sw.removed.Load)
		h.completedJobs(1)
		time.Sleep(100 * time.Millisecond) // a second finalisation would follow the first at once
		if got := promtest.ToFloat64(h.proc.m.jobs.WithLabelValues(StatusCompleted)); got != 1 {
			t.Errorf("jobs_processed_total{completed} = %v, want 1", got)
		}
		if logged.String() != "" {
			t.Errorf("errors logged: %s", logged.String())
		}
	})
}

// twiceQueued puts every batch in the queue twice, as creation and the
// sweep's re-queue can before a worker takes it.
type twiceQueued struct{ Store }

func (s twiceQueued) Enqueue(ctx context.Context, id string, deadline time.Time) error {
	if err := s.Store.Enqueue(ctx, id, deadline); err != nil {
		return err
	}
	return s.Store.Enqueue(ctx, id, deadline)
}

// TestBatchQueuedTwiceRunsOnce: two workers of one process never run the
// same batch at once (the lease is theirs either way): every line is sent
// once and the job counts once.
func TestBatchQueuedTwiceRunsOnce(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		var sent atomic.Int64
		gw := chatGateway(t)
		counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent.Add(1); gw.ServeHTTP(w, r) })
		h := newHarness(t, twiceQueued{s}, counting, nil)
		lines := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		f, _, _ := h.upload("", PurposeBatch, "in.jsonl", chatInput(lines...))
		b, _, _ := h.createBatch("", map[string]any{"input_file_id": f.ID, "endpoint": chatURL, "completion_window": "24h"})
		if b = h.wait("", b.ID); b.Status != StatusCompleted {
			t.Fatalf("%+v", b)
		}
		h.completedJobs(1)
		time.Sleep(200 * time.Millisecond) // room for a second run to show
		if n := sent.Load(); n != int64(len(lines)) {
			t.Errorf("the gateway got %d requests for %d lines", n, len(lines))
		}
		if got := promtest.ToFloat64(h.proc.m.jobs.WithLabelValues(StatusCompleted)); got != 1 {
			t.Errorf("jobs_processed_total{completed} = %v, want 1", got)
		}
	})
}
