package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// ServerConfig configures the API server.
type ServerConfig struct {
	Store Store
	Blobs *Blobs
	// TenantHeader names the header whose value owns files and batches
	// (llm-d's default X-MaaS-Username); requests without it share the
	// tenant "".
	TenantHeader string
	MaxFileBytes int64
	Logger       *slog.Logger
	// Metrics, if set, is served at GET /metrics.
	Metrics http.Handler
}

// Server serves the OpenAI Files and Batch APIs.
type Server struct {
	c   ServerConfig
	mux *http.ServeMux
}

func NewServer(c ServerConfig) *Server {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{c: c, mux: http.NewServeMux()}
	s.handle("POST /v1/files", s.createFile)
	s.handle("GET /v1/files", s.listFiles)
	s.handle("GET /v1/files/{id}", s.getFile)
	s.handle("DELETE /v1/files/{id}", s.deleteFile)
	s.handle("GET /v1/files/{id}/content", s.fileContent)
	s.handle("POST /v1/batches", s.createBatch)
	s.handle("GET /v1/batches", s.listBatches)
	s.handle("GET /v1/batches/{id}", s.getBatch)
	s.handle("POST /v1/batches/{id}/cancel", s.cancelBatch)
	if c.Metrics != nil {
		s.mux.Handle("GET /metrics", c.Metrics)
	}
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)})
	})
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// handle adapts a handler that returns its object or error.
func (s *Server) handle(pattern string, h func(*http.Request, string) (any, error)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		v, err := h(r, r.Header.Get(s.c.TenantHeader))
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) {
				s.c.Logger.Error("request", "method", r.Method, "path", r.URL.Path, "err", err)
				ae = &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "The server had an error processing your request."}
			}
			writeError(w, ae)
			return
		}
		if f, ok := v.(contentStream); ok {
			f.serve(w)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, map[string]*apiError{"error": e})
}

// newID makes an id that sorts by creation time: 16 hex digits of
// nanoseconds, then random hex.
var lastNanos atomic.Int64

func newID(prefix string, randBytes int) string {
	n := time.Now().UnixNano()
	for {
		last := lastNanos.Load()
		if n <= last {
			n = last + 1
		}
		if lastNanos.CompareAndSwap(last, n) {
			break
		}
	}
	b := make([]byte, randBytes)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s%016x%s", prefix, n, hex.EncodeToString(b))
}

func (s *Server) createFile(r *http.Request, tenant string) (any, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return nil, invalid("", "", "Uploads must be multipart/form-data with the fields 'file' and 'purpose'.")
	}
	r.Body = http.MaxBytesReader(nil, r.Body, s.c.MaxFileBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, invalid("", "", "Could not parse the multipart form: "+err.Error())
	}
	id := newID("file-", 4)
	rec := FileRecord{Tenant: tenant, File: File{ID: id, Object: "file", Status: "processed"}}
	var (
		gotFile     bool
		anchor      string
		expiresSecs string
	)
	defer func() {
		if !gotFile || rec.CreatedAt == 0 { // not stored: drop the content
			_ = s.c.Blobs.Remove(id)
		}
	}()
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, invalid("", "", "Could not parse the multipart form: "+err.Error())
		}
		switch part.FormName() {
		case "file":
			if gotFile {
				return nil, invalid("file", "", "Only one 'file' may be uploaded.")
			}
			n, err := s.c.Blobs.Put(id, part, s.c.MaxFileBytes)
			var mbe *http.MaxBytesError
			if errors.Is(err, errTooLarge) || errors.As(err, &mbe) {
				return nil, invalid("file", "file_too_large", fmt.Sprintf("The file is larger than the %d bytes allowed.", s.c.MaxFileBytes))
			}
			if err != nil {
				return nil, err
			}
			gotFile, rec.Bytes, rec.Filename = true, n, part.FileName()
		case "purpose", "expires_after[anchor]", "expires_after[seconds]":
			v, err := io.ReadAll(io.LimitReader(part, 1024))
			if err != nil {
				return nil, invalid("", "", "Could not parse the multipart form: "+err.Error())
			}
			switch part.FormName() {
			case "purpose":
				rec.Purpose = string(v)
			case "expires_after[anchor]":
				anchor = string(v)
			default:
				expiresSecs = string(v)
			}
		}
		part.Close()
	}
	if !gotFile {
		return nil, invalid("file", "", "Missing required parameter: 'file'.")
	}
	if rec.Purpose == "" {
		return nil, invalid("purpose", "", "Missing required parameter: 'purpose'.")
	}
	if !validPurposes[rec.Purpose] {
		return nil, invalid("purpose", "", fmt.Sprintf("'%s' is not one of the supported purposes.", rec.Purpose))
	}
	rec.CreatedAt = time.Now().Unix()
	if anchor != "" || expiresSecs != "" {
		secs, err := strconv.ParseInt(expiresSecs, 10, 64)
		if anchor != "created_at" || err != nil || secs < 3600 || secs > 2592000 {
			rec.CreatedAt = 0
			return nil, invalid("expires_after", "", "expires_after needs anchor 'created_at' and seconds between 3600 and 2592000.")
		}
		rec.ExpiresAt = ptr(rec.CreatedAt + secs)
	}
	if err := s.c.Store.PutFile(r.Context(), rec); err != nil {
		rec.CreatedAt = 0
		return nil, err
	}
	return rec.File, nil
}

// ownFile returns the tenant's file id.
func (s *Server) ownFile(ctx context.Context, tenant, id, param string) (FileRecord, error) {
	f, err := s.c.Store.GetFile(ctx, id)
	if errors.Is(err, ErrNotFound) || (err == nil && f.Tenant != tenant) {
		return f, notFound(param, fmt.Sprintf("No such File object: %s", id))
	}
	return f, err
}

func (s *Server) getFile(r *http.Request, tenant string) (any, error) {
	f, err := s.ownFile(r.Context(), tenant, r.PathValue("id"), "id")
	return f.File, err
}

func (s *Server) deleteFile(r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	if _, err := s.ownFile(r.Context(), tenant, id, "id"); err != nil {
		return nil, err
	}
	active, err := s.c.Store.Active(r.Context())
	if err != nil {
		return nil, err
	}
	for _, bid := range active {
		b, err := s.c.Store.GetBatch(r.Context(), bid)
		if err == nil && b.InputFileID == id && !final(b.Status) {
			e := invalid("id", "", fmt.Sprintf("The file %s is the input of batch %s, which is %s; delete it once the batch has ended.", id, bid, b.Status))
			e.Status = http.StatusConflict
			return nil, e
		}
	}
	if err := s.c.Store.DeleteFile(r.Context(), id); err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err := s.c.Blobs.Remove(id); err != nil {
		return nil, err
	}
	return struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "file", true}, nil
}

// contentStream is a file's content as a response.
type contentStream struct {
	s  *Server
	id string
	n  int64
}

func (c contentStream) serve(w http.ResponseWriter) {
	f, err := c.s.c.Blobs.Open(c.id)
	if err != nil {
		writeError(w, notFound("id", "No such File object: "+c.id))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(c.n, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, f)
}

func (s *Server) fileContent(r *http.Request, tenant string) (any, error) {
	f, err := s.ownFile(r.Context(), tenant, r.PathValue("id"), "id")
	if err != nil {
		return nil, err
	}
	return contentStream{s: s, id: f.ID, n: f.Bytes}, nil
}

// page cuts a newest-first list after the cursor: ids sort by creation.
func page[T any](items []T, id func(T) string, r *http.Request, defLimit, maxLimit int, asc bool) (list[T], error) {
	q := r.URL.Query()
	limit := defLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return list[T]{}, invalid("limit", "", fmt.Sprintf("limit must be an integer between 1 and %d.", maxLimit))
		}
		limit = n
	}
	if asc {
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	}
	if after := q.Get("after"); after != "" {
		k := len(items)
		for i, it := range items {
			if (asc && id(it) > after) || (!asc && id(it) < after) {
				k = i
				break
			}
		}
		items = items[k:]
	}
	out := list[T]{Object: "list", Data: items}
	if len(items) > limit {
		out.Data, out.HasMore = items[:limit], true
	}
	if out.Data == nil {
		out.Data = []T{}
	}
	if n := len(out.Data); n > 0 {
		out.FirstID, out.LastID = strp(id(out.Data[0])), strp(id(out.Data[n-1]))
	}
	return out, nil
}

func (s *Server) listFiles(r *http.Request, tenant string) (any, error) {
	all, err := s.c.Store.ListFiles(r.Context())
	if err != nil {
		return nil, err
	}
	purpose := r.URL.Query().Get("purpose")
	var files []File
	for _, f := range all {
		if f.Tenant == tenant && (purpose == "" || f.Purpose == purpose) {
			files = append(files, f.File)
		}
	}
	order := r.URL.Query().Get("order")
	if order != "" && order != "asc" && order != "desc" {
		return nil, invalid("order", "", "order must be 'asc' or 'desc'.")
	}
	return page(files, func(f File) string { return f.ID }, r, 10000, 10000, order == "asc")
}

// Endpoints a batch may target.
var batchEndpoints = map[string]bool{
	"/v1/responses": true, "/v1/chat/completions": true, "/v1/embeddings": true, "/v1/completions": true, "/v1/moderations": true,
}

type createBatchRequest struct {
	InputFileID        string            `json:"input_file_id"`
	Endpoint           string            `json:"endpoint"`
	CompletionWindow   string            `json:"completion_window"`
	Metadata           map[string]string `json:"metadata"`
	OutputExpiresAfter *struct {
		Anchor  string `json:"anchor"`
		Seconds int64  `json:"seconds"`
	} `json:"output_expires_after"`
}

func (s *Server) createBatch(r *http.Request, tenant string) (any, error) {
	var req createBatchRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		return nil, invalid("", "", "We could not parse the JSON body of your request: "+err.Error())
	}
	switch {
	case req.InputFileID == "":
		return nil, invalid("input_file_id", "", "Missing required parameter: 'input_file_id'.")
	case req.Endpoint == "":
		return nil, invalid("endpoint", "", "Missing required parameter: 'endpoint'.")
	case !batchEndpoints[req.Endpoint]:
		return nil, invalid("endpoint", "", fmt.Sprintf("Invalid value: '%s'. Supported values are: '/v1/responses', '/v1/chat/completions', '/v1/embeddings', '/v1/completions' and '/v1/moderations'.", req.Endpoint))
	case req.CompletionWindow == "":
		return nil, invalid("completion_window", "", "Missing required parameter: 'completion_window'.")
	}
	window, err := time.ParseDuration(req.CompletionWindow)
	if err != nil || window < time.Second {
		return nil, invalid("completion_window", "", fmt.Sprintf("Invalid value: '%s'. completion_window is a duration of at least 1s, such as '24h'.", req.CompletionWindow))
	}
	if len(req.Metadata) > 16 {
		return nil, invalid("metadata", "", "metadata may have at most 16 keys.")
	}
	for k, v := range req.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return nil, invalid("metadata", "", "metadata keys are at most 64 characters and values at most 512.")
		}
	}
	var expiresAfter int64
	if oe := req.OutputExpiresAfter; oe != nil {
		if oe.Anchor != "created_at" {
			return nil, invalid("output_expires_after.anchor", "", "output_expires_after.anchor must be 'created_at'.")
		}
		if oe.Seconds < 3600 || oe.Seconds > 2592000 {
			return nil, invalid("output_expires_after.seconds", "", "output_expires_after.seconds must be between 3600 (1 hour) and 2592000 (30 days).")
		}
		expiresAfter = oe.Seconds
	}
	f, err := s.ownFile(r.Context(), tenant, req.InputFileID, "input_file_id")
	if err != nil {
		return nil, err
	}
	if f.Purpose != PurposeBatch {
		return nil, invalid("input_file_id", "", fmt.Sprintf("The file %s has purpose '%s'; a batch's input file needs purpose 'batch'.", f.ID, f.Purpose))
	}
	created := time.Now()
	b := BatchRecord{Tenant: tenant, OutputExpiresAfter: expiresAfter, Batch: Batch{
		ID: newID("batch_", 8), Object: "batch", Endpoint: req.Endpoint, InputFileID: req.InputFileID,
		CompletionWindow: req.CompletionWindow, Status: StatusValidating, CreatedAt: created.Unix(),
		ExpiresAt: ptr(created.Add(window).Unix()), Metadata: req.Metadata,
	}}
	if err := s.c.Store.CreateBatch(r.Context(), b); err != nil {
		return nil, err
	}
	if err := s.c.Store.Enqueue(r.Context(), b.ID, created.Add(window)); err != nil {
		// The batch is active: the processors' sweep queues it.
		s.c.Logger.Warn("enqueue", "id", b.ID, "err", err)
	}
	return b.Batch, nil
}

func (s *Server) ownBatch(ctx context.Context, tenant, id string) (BatchRecord, error) {
	b, err := s.c.Store.GetBatch(ctx, id)
	if errors.Is(err, ErrNotFound) || (err == nil && b.Tenant != tenant) {
		return b, notFound("batch_id", fmt.Sprintf("No batch found with id '%s'.", id))
	}
	return b, err
}

func (s *Server) getBatch(r *http.Request, tenant string) (any, error) {
	b, err := s.ownBatch(r.Context(), tenant, r.PathValue("id"))
	return b.Batch, err
}

func (s *Server) listBatches(r *http.Request, tenant string) (any, error) {
	all, err := s.c.Store.ListBatches(r.Context())
	if err != nil {
		return nil, err
	}
	var bs []Batch
	for _, b := range all {
		if b.Tenant == tenant {
			bs = append(bs, b.Batch)
		}
	}
	return page(bs, func(b Batch) string { return b.ID }, r, 20, 100, false)
}

// errNotCancellable aborts a cancel of a batch that has ended.
var errNotCancellable = errors.New("not cancellable")

func (s *Server) cancelBatch(r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	if _, err := s.ownBatch(r.Context(), tenant, id); err != nil {
		return nil, err
	}
	var status string
	b, err := s.c.Store.UpdateBatch(r.Context(), id, func(b *BatchRecord) error {
		status = b.Status
		switch b.Status {
		case StatusValidating, StatusInProgress, StatusFinalizing:
			b.Status, b.CancellingAt = StatusCancelling, now()
			return nil
		case StatusCancelling:
			return nil
		}
		return errNotCancellable
	})
	if errors.Is(err, errNotCancellable) {
		e := invalid("", "", fmt.Sprintf("Cannot cancel a batch with status '%s'.", status))
		e.Status = http.StatusConflict
		return nil, e
	}
	return b.Batch, err
}
