package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// accessRecord collects one request's access-log fields; it belongs to the
// ServeHTTP goroutine.
type accessRecord struct {
	start     time.Time
	method    string
	path      string
	requestID string
	endpoint  string
	outcome   string
	status    int
	decided   time.Duration // until the upstream was known
	upstream  time.Duration // until the upstream's response headers
	in        *countingReader
	out       int64
	err       error
}

func (g *Gateway) logAccess(ctx context.Context, rec *accessRecord) {
	attrs := []slog.Attr{
		slog.String("method", rec.method),
		slog.String("path", rec.path),
		slog.Int("status", rec.status),
		slog.String("endpoint", rec.endpoint),
		slog.String("outcome", rec.outcome),
		slog.String("request_id", rec.requestID),
		slog.Float64("decision_ms", ms(rec.decided)),
		slog.Float64("upstream_ms", ms(rec.upstream)),
		slog.Float64("total_ms", ms(time.Since(rec.start))),
		slog.Int64("bytes_in", rec.in.n.Load()),
		slog.Int64("bytes_out", rec.out),
	}
	if rec.err != nil {
		attrs = append(attrs, slog.String("err", rec.err.Error()))
	}
	g.log.LogAttrs(ctx, slog.LevelInfo, "access", attrs...)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// fail answers with err's status before any response byte was written.
func (g *Gateway) fail(w http.ResponseWriter, rec *accessRecord, err error) {
	status := http.StatusInternalServerError
	msg := "internal error"
	var se *statusError
	if errors.As(err, &se) {
		status, msg = se.status, se.msg
		if se.close {
			w.Header().Set("connection", "close")
		}
	}
	rec.err = err
	if rec.outcome == "" || rec.outcome == "routed" || rec.outcome == "fail_open" {
		rec.outcome = "error"
	}
	writeLocal(w, rec, status, [][2]string{{"content-type", "text/plain; charset=utf-8"}}, []byte(msg+"\n"))
}

// abort ends a response whose headers are already out: the client must
// see a broken stream, not a clean end. http.ErrAbortHandler is net/http's
// way to do that (connection closed, HTTP/2 stream reset) without a stack
// trace in the log.
func abort(rec *accessRecord, err error) {
	rec.err = err
	rec.outcome = "aborted"
	panic(http.ErrAbortHandler)
}

func writeLocal(w http.ResponseWriter, rec *accessRecord, status int, headers [][2]string, body []byte) {
	h := w.Header()
	headerList(headers).toHTTP(h)
	h.Set("content-length", strconv.Itoa(len(body)))
	rec.status = status
	w.WriteHeader(status)
	n, _ := w.Write(body)
	rec.out += int64(n)
}

func (g *Gateway) writeImmediate(w http.ResponseWriter, rec *accessRecord, imm *extprocv3.ImmediateResponse) {
	status := int(imm.GetStatus().GetCode())
	if status < 200 || status > 599 {
		status = http.StatusOK
	}
	headers := headerList(nil).apply(imm.GetHeaders())
	if imm.GetDetails() != "" {
		rec.err = errors.New(imm.GetDetails())
	}
	writeLocal(w, rec, status, headers, imm.GetBody())
}

// writeHead writes the status line and headers of a proxied response.
func writeHead(w http.ResponseWriter, rec *accessRecord, rh headerList) {
	status := http.StatusBadGateway
	if v, ok := rh.get(":status"); ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 100 && n <= 599 {
			status = n
		}
	}
	rh.toHTTP(w.Header())
	rec.status = status
	w.WriteHeader(status)
}

// writeResponse copies a response straight through, flushing every chunk.
func (g *Gateway) writeResponse(w http.ResponseWriter, rec *accessRecord, rh headerList, body io.Reader, trailer http.Header) {
	writeHead(w, rec, rh)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if err := writeFlush(w, rc, rec, buf[:n]); err != nil {
				abort(rec, err)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			abort(rec, err)
		}
	}
	for name, values := range trailer {
		for _, v := range values {
			w.Header().Add(http.TrailerPrefix+name, v)
		}
	}
}

// writeFlush writes one chunk and flushes it: an SSE event must reach the
// client when the model server sends it.
func writeFlush(w http.ResponseWriter, rc *http.ResponseController, rec *accessRecord, b []byte) error {
	n, err := w.Write(b)
	rec.out += int64(n)
	if err != nil {
		return err
	}
	return rc.Flush()
}

// streamThroughPicker sends the response body to the picker chunk by chunk
// and writes what it streams back (FULL_DUPLEX_STREAMED), then trailers.
func (g *Gateway) streamThroughPicker(ctx context.Context, w http.ResponseWriter, rec *accessRecord, p *processor, rh headerList, resp *http.Response) {
	// The picker may rewrite the body, so its length is no longer known.
	writeHead(w, rec, rh.without("content-length"))
	rc := http.NewResponseController(w)
	// The upstream body goes to the picker on its own goroutine; each
	// chunk comes back here. Until the last chunk is sent no reply need be
	// pending (the upstream may be slow), so the picker's message timeout
	// applies only after that; a failed upstream read ends the loop at
	// once instead of waiting for replies that will never come.
	sendDone := make(chan struct{})
	var sendErr error
	var trailers headerList
	go func() {
		defer close(sendDone)
		trailers, sendErr = sendResponseBody(p, resp)
	}()
	sending := true
	for {
		var m *extprocv3.ProcessingResponse
		var err error
		if sending {
			m, err = p.nextUntil(ctx, sendDone)
			if errors.Is(err, errStopped) {
				sending = false
				if sendErr != nil {
					abort(rec, sendErr)
				}
				continue
			}
		} else {
			m, err = p.next(ctx)
		}
		if err != nil {
			abort(rec, err)
		}
		if tr := m.GetResponseTrailers(); tr != nil {
			// Trailers end the stream in place of an end-of-stream chunk.
			if <-sendDone; sendErr != nil || trailers == nil {
				abort(rec, errors.New("ext_proc: trailers response to no trailers"))
			}
			for _, kv := range trailers.apply(tr.GetHeaderMutation()) {
				w.Header().Add(http.TrailerPrefix+kv[0], kv[1])
			}
			return
		}
		sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			abort(rec, errors.New("ext_proc: want a streamed response body"))
		}
		if len(sr.GetBody()) > 0 {
			if err := writeFlush(w, rc, rec, sr.GetBody()); err != nil {
				abort(rec, err)
			}
		}
		if sr.GetEndOfStream() {
			break
		}
	}
	if <-sendDone; sendErr != nil {
		abort(rec, sendErr)
	}
}

// sendResponseBody sends the upstream body to the picker in chunks. Its end
// is an end-of-stream chunk or, when the upstream sent trailers (known only
// once the body is read), the trailers, as Envoy does: a body chunk with
// end of stream is never followed by trailers. It returns the trailers it
// sent.
func sendResponseBody(p *processor, resp *http.Response) (headerList, error) {
	buf := make([]byte, chunkSize)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if serr := p.send(responseBody(buf[:n], false)); serr != nil {
				return nil, serr
			}
		}
		if errors.Is(err, io.EOF) {
			// Announced trailers may never come: then nothing follows.
			tl := trailerList(resp.Trailer)
			if len(tl) == 0 {
				return nil, p.send(responseBody(nil, true))
			}
			return tl, p.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
				ResponseTrailers: &extprocv3.HttpTrailers{Trailers: tl.proto()},
			}})
		}
		if err != nil {
			return nil, err
		}
	}
}

func responseBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos},
	}}
}
