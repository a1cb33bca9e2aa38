package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/bytebudget"
)

// maxLegResponse bounds a buffered prefill or encode answer: one token and
// its parameters.
const maxLegResponse = 16 << 20

// handle serves one intercepted API path: the encode stage when encoders
// are named, the connector's P/D protocol when a prefiller is, the P2P
// pull injection when a KV source is, and otherwise the request goes to
// the local model server untouched.
func (s *Server) handle(a api) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.m.requests.WithLabelValues(a.name).Inc()
		prefillers, perr := splitHosts(takeHeader(r.Header, prefillerHeaders))
		encoders, _ := splitHosts(takeHeader(r.Header, encoderHeaders))
		sources, _ := splitHosts(takeHeader(r.Header, kvSourceHeaders))

		prefiller := ""
		if perr != nil {
			s.deny(w, r, stagePrefill, "", perr)
			return
		}
		if len(prefillers) > 0 {
			pick := prefillers[0]
			if s.o.EnablePrefillerSampling {
				pick = prefillers[s.intn(len(prefillers))]
			}
			hp, err := s.pool.check(pick)
			if err != nil {
				s.deny(w, r, stagePrefill, pick, err)
				return
			}
			prefiller = hp
		}
		var allowed []string
		if s.o.ECConnector != "" && a.path == apis[0].path {
			for _, e := range encoders {
				hp, err := s.pool.check(e)
				if err != nil {
					s.m.denied.WithLabelValues(stageEncode).Inc()
					s.log.Warn("SSRF protection: encoder dropped", "target", e, "err", err, "client", r.RemoteAddr)
					continue
				}
				allowed = append(allowed, hp)
			}
			if len(encoders) > 0 && len(allowed) == 0 {
				s.log.Info("no encoder left; continuing without the encode stage")
			}
		}
		source := ""
		if s.o.KVConnector == ConnectorOffloading || s.o.EnableP2PPull {
			if len(sources) > 0 {
				hp, err := s.pool.check(sources[0])
				if err != nil {
					s.m.denied.WithLabelValues(stageKVPull).Inc()
					s.log.Warn("KV source ignored", "target", sources[0], "err", err)
				} else if !isSelf(hp) {
					source = hp
				}
			}
		}
		if prefiller == "" && len(allowed) == 0 && source == "" {
			s.passThrough(w, r)
			return
		}

		// The body's bytes stay reserved while its legs run: the parsed
		// body and each leg's copy live as long as the request.
		held := s.bodies.Hold()
		defer held.Done()
		raw, eof, err := bytebudget.ReadUpTo(r.Body, int(s.o.MaxRequestBodyBytes)+1, &held)
		switch {
		case errors.Is(err, bytebudget.ErrExhausted):
			s.m.bodyBudgetFull.Inc()
			writeError(w, newError(http.StatusServiceUnavailable, "request body refused: sidecar memory budget (--body-budget-bytes %d) exhausted", s.o.BodyBudgetBytes))
			return
		case err != nil:
			writeError(w, newError(http.StatusBadRequest, "reading the request body: %v", err))
			return
		case !eof: // ReadUpTo stopped at one byte past the limit
			writeError(w, newError(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", s.o.MaxRequestBodyBytes))
			return
		}
		b, err := parseBody(raw)
		if err != nil {
			writeError(w, newError(http.StatusBadRequest, "%v", err))
			return
		}
		id := newRequestID()
		var ec json.RawMessage
		if len(allowed) > 0 {
			var ok bool
			if ec, ok = s.encode(w, r, b, id, allowed); !ok {
				return
			}
		}
		switch {
		case prefiller == "":
			dec := b.clone()
			if ec != nil {
				dec["ec_transfer_params"] = ec
			}
			if source != "" {
				// A pull rebuilds kv_transfer_params: the client's are dropped.
				dec.set("kv_transfer_params", map[string]any{"remote_kv_source": s.kvSource(id, source)})
			}
			s.decode(w, r, dec, id, nil)
		case s.o.KVConnector == ConnectorOffloading:
			s.offloading(w, r, a, b, id, prefiller, source, ec)
		case s.o.KVConnector == ConnectorSharedStorage:
			s.sharedStorage(w, r, a, b, id, prefiller, ec)
		default:
			s.nixlv2(w, r, a, b, id, prefiller, source, ec)
		}
	}
}

// deny refuses a request whose prefill target may not be dialled.
func (s *Server) deny(w http.ResponseWriter, r *http.Request, stage, target string, err error) {
	s.m.denied.WithLabelValues(stage).Inc()
	s.log.Warn("SSRF protection: prefill target refused", "target", target, "err", err, "client", r.RemoteAddr, "path", r.URL.Path)
	if errors.Is(err, errPoolUnknown) {
		writeError(w, newError(http.StatusServiceUnavailable, "prefill target %q: %v", target, err))
		return
	}
	writeError(w, newError(http.StatusForbidden, "Forbidden: prefill target not allowed by SSRF protection: %v", err))
}

// isSelf reports whether hp is this pod (POD_IP), whose own cache needs
// no pull.
func isSelf(hp string) bool {
	host, _, _ := net.SplitHostPort(hp)
	ip := os.Getenv("POD_IP")
	return ip != "" && host == ip
}

// kvSource is kv_transfer_params.remote_kv_source for a pull from hp's
// OffloadingConnector p2p tier (rank 0: one data-parallel rank).
func (s *Server) kvSource(id, hp string) map[string]any {
	host, _, _ := net.SplitHostPort(hp)
	return map[string]any{"kv_request_id": id, "remote_host": host, "remote_port": s.o.P2PConnectorPort}
}

// legResult is a buffered upstream answer.
type legResult struct {
	status int
	header http.Header
	body   []byte
}

func (l *legResult) ok() bool { return l.status >= 200 && l.status < 300 }

// writeTo returns a failed leg's answer to the client as it came.
func (l *legResult) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, vs := range l.header {
		h[k] = vs
	}
	for _, k := range hopHeaders[:len(hopHeaders)-1] {
		h.Del(k)
	}
	h.Set("Content-Length", strconv.Itoa(len(l.body)))
	w.WriteHeader(l.status)
	_, _ = w.Write(l.body)
}

func retryable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// send posts one buffered leg to target, retrying 502/503/504 (and a
// connection that fails, which a proxy would answer 502) up to retries
// times with backoff between attempts.
func (s *Server) send(ctx context.Context, c *http.Client, r *http.Request, target, id string, b []byte, retries int) (*legResult, *apiError) {
	var last *apiError
	for attempt := 0; ; attempt++ {
		res, err := s.sendOnce(ctx, c, r, target, id, b)
		switch {
		case ctx.Err() != nil:
			return nil, newError(http.StatusGatewayTimeout, "%s: %v", target, context.Cause(ctx))
		case err != nil:
			last = newError(http.StatusBadGateway, "%s: %v", target, err)
		case !retryable(res.status):
			return res, nil
		default:
			last = nil
		}
		if attempt >= retries {
			if last != nil {
				return nil, last
			}
			return res, nil
		}
		s.log.Info("retrying leg", "target", target, "attempt", attempt+1, "request_id", id)
		select {
		case <-ctx.Done():
		case <-time.After(s.o.PrefillRetryBackoff):
		}
	}
}

func (s *Server) sendOnce(ctx context.Context, c *http.Client, r *http.Request, target, id string, b []byte) (*legResult, error) {
	req, err := newLeg(ctx, r, target, id, b)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxLegResponse+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxLegResponse {
		return nil, errors.New("answer larger than 16 MiB")
	}
	return &legResult{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// prefill sends the prefill leg, timing it; nil means the client has its
// answer (the failure).
func (s *Server) prefill(w http.ResponseWriter, ctx context.Context, r *http.Request, prefiller, id string, b body) *legResult {
	start := time.Now()
	res, aerr := s.send(ctx, s.prefillC, r, s.prefix[stagePrefiller]+prefiller+r.URL.RequestURI(), id, b.marshal(), s.o.PrefillMaxRetries)
	s.m.prefill.WithLabelValues(s.o.KVConnector).Observe(time.Since(start).Seconds())
	if aerr != nil {
		s.m.errors.WithLabelValues(s.o.KVConnector, stagePrefill).Inc()
		s.log.Warn("prefill leg failed", "prefiller", prefiller, "request_id", id, "err", aerr)
		if w != nil && r.Context().Err() == nil {
			writeError(w, aerr)
		}
		return nil
	}
	if !res.ok() {
		// llm-d has no local-prefill fallback: the prefiller's answer is the
		// client's.
		s.m.errors.WithLabelValues(s.o.KVConnector, stagePrefill).Inc()
		s.log.Warn("prefill leg refused", "prefiller", prefiller, "request_id", id, "status", res.status)
		if w != nil {
			res.writeTo(w)
		}
		return nil
	}
	return res
}

// nixlv2 is llm-d's standard NIXL READ protocol: a one-token prefill leg
// asking the prefiller to keep the KV for a remote decode, then the
// client's own request to the local decoder with the kv_transfer_params
// the prefiller returned, its usage showing the prefiller's cached_tokens.
func (s *Server) nixlv2(w http.ResponseWriter, r *http.Request, a api, b body, id, prefiller, source string, ec json.RawMessage) {
	pre := s.prefillLeg(a, b, map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}, id, prefiller, source, ec)
	res := s.prefill(w, r.Context(), r, prefiller, id, pre)
	if res == nil {
		return
	}
	var answer map[string]json.RawMessage
	if err := json.Unmarshal(res.body, &answer); err != nil || answer == nil {
		s.m.errors.WithLabelValues(s.o.KVConnector, stagePrefill).Inc()
		writeError(w, newError(http.StatusBadGateway, "prefiller %s answered a body that is not a JSON object", prefiller))
		return
	}
	params, ok := answer["kv_transfer_params"]
	if !ok {
		s.log.Warn("prefiller's answer has no kv_transfer_params; the decoder will prefill", "prefiller", prefiller, "request_id", id)
		params = json.RawMessage("null")
	}
	cached := cachedTokens(answer["usage"])
	dec := b.clone()
	dec["kv_transfer_params"] = params
	s.handedOff(prefiller)
	s.decode(w, r, dec, id, &cached)
}

// prefillLeg is the client's body as a one-token prefill leg carrying kv
// as kv_transfer_params, plus a P2P pull from source (unless it is the
// prefiller: llm-d's only multi-key combination) and the encoders'
// outputs.
func (s *Server) prefillLeg(a api, b body, kv map[string]any, id, prefiller, source string, ec json.RawMessage) body {
	pre := b.clone()
	if source != "" && source != prefiller {
		kv["remote_kv_source"] = s.kvSource(id, source)
	}
	pre.set("kv_transfer_params", kv)
	if ec != nil {
		pre["ec_transfer_params"] = ec
	}
	pre.capSingleToken(a)
	return pre
}

// cachedTokens reads usage.prompt_tokens_details.cached_tokens; absent or
// null is 0, as vLLM writes null when nothing was cached.
func cachedTokens(usage json.RawMessage) int {
	var u struct {
		Details *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if json.Unmarshal(usage, &u) != nil || u.Details == nil {
		return 0
	}
	return u.Details.Cached
}

func hostOf(hp string) string {
	h, _, _ := net.SplitHostPort(hp)
	return h
}

// offloading is llm-d's OffloadingConnector protocol: prefill and decode
// go out at once, the decoder pulling the prefiller's KV from its p2p tier
// as it lands; the prefill answer is discarded, and the leg runs on even
// when the decode ends first (the prefiller's tier must still be filled).
func (s *Server) offloading(w http.ResponseWriter, r *http.Request, a api, b body, id, prefiller, source string, ec json.RawMessage) {
	pre := s.prefillLeg(a, b, map[string]any{"remote_decoder": map[string]any{"kv_request_id": id}}, id, prefiller, source, ec)
	// The leg needs the client's headers after the handler has returned.
	legReq := r.Clone(s.ctx)
	s.bg.Go(func() { s.prefill(nil, s.ctx, legReq, prefiller, id, pre) })
	dec := b.clone()
	dec.set("kv_transfer_params", map[string]any{"remote_prefiller": map[string]any{
		"kv_request_id": id, "remote_host": hostOf(prefiller), "remote_port": s.o.P2PConnectorPort}})
	s.handedOff(prefiller)
	s.decode(w, r, dec, id, nil)
}

// sharedStorage is llm-d's SharedStorageConnector protocol: a request with
// cache_hit_threshold tries the decoder first, which answers finish_reason
// "cache_threshold" when too little of the prompt is cached; then (or
// without a threshold) the prefiller writes the KV to the shared storage
// and the decoder runs with cache_hit_threshold 0.
func (s *Server) sharedStorage(w http.ResponseWriter, r *http.Request, a api, b body, id, prefiller string, ec json.RawMessage) {
	if _, ok := b["cache_hit_threshold"]; ok {
		if s.tryDecode(w, r, b, id) {
			return
		}
	}
	pre := b.clone()
	pre.capSingleToken(a)
	pre["cache_hit_threshold"] = json.RawMessage("0")
	if ec != nil {
		pre["ec_transfer_params"] = ec
	}
	if s.prefill(w, r.Context(), r, prefiller, id, pre) == nil {
		return
	}
	dec := b.clone()
	dec["cache_hit_threshold"] = json.RawMessage("0")
	s.handedOff(prefiller)
	s.decode(w, r, dec, id, nil)
}

// tryDecode runs the decoder first; it reports whether the client has its
// answer (false: the decoder wants a prefill first).
func (s *Server) tryDecode(w http.ResponseWriter, r *http.Request, b body, id string) bool {
	resp, err := s.sendDecode(r, id, b)
	if errors.Is(err, errBadLeg) {
		writeError(w, newError(http.StatusInternalServerError, "%v", err))
		return true
	}
	if err != nil {
		if r.Context().Err() == nil {
			writeError(w, errDecoderDown())
		}
		return true
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var head bytes.Buffer
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if b.stream() {
			// Up to the first chunk that carries a choice.
			for {
				line, err := br.ReadSlice('\n')
				head.Write(line)
				payload, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
				if ok && hasChoice(payload) {
					if finishReason(payload) == "cache_threshold" {
						return false
					}
					break
				}
				if err != nil || head.Len() > maxSSELine {
					break
				}
			}
		} else {
			all, _ := io.ReadAll(io.LimitReader(br, maxJSONResponse))
			if finishReason(all) == "cache_threshold" {
				return false
			}
			head.Write(all)
		}
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(&head, br), resp.Body}
	if err := copyResponse(w, resp); err != nil {
		s.abortResponse(r, stageDecode, err)
	}
	return true
}

type choicesOnly struct {
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func hasChoice(doc []byte) bool {
	var c choicesOnly
	return json.Unmarshal(bytes.TrimSpace(doc), &c) == nil && len(c.Choices) > 0
}

func finishReason(doc []byte) string {
	var c choicesOnly
	if json.Unmarshal(bytes.TrimSpace(doc), &c) != nil || len(c.Choices) == 0 || c.Choices[0].FinishReason == nil {
		return ""
	}
	return *c.Choices[0].FinishReason
}

// decode sends b to the local model server and streams its answer to the
// client; with cached set, the answer's usage shows that many cached
// tokens (the prefiller's).
func (s *Server) decode(w http.ResponseWriter, r *http.Request, b body, id string, cached *int) {
	start := time.Now()
	defer func() { s.m.decode.WithLabelValues(s.o.KVConnector).Observe(time.Since(start).Seconds()) }()
	resp, err := s.sendDecode(r, id, b)
	if errors.Is(err, errBadLeg) {
		writeError(w, newError(http.StatusInternalServerError, "%v", err))
		return
	}
	if err != nil {
		if r.Context().Err() == nil {
			s.m.errors.WithLabelValues(s.o.KVConnector, stageDecode).Inc()
			s.log.Warn("model server unreachable", "err", err)
			writeError(w, errDecoderDown())
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s.m.errors.WithLabelValues(s.o.KVConnector, stageDecode).Inc()
	}
	if cached == nil {
		if err := copyResponse(w, resp); err != nil {
			s.abortResponse(r, stageDecode, err)
		}
		return
	}
	uw := newUsageWriter(w, *cached)
	if err := copyResponse(uw, resp); err != nil {
		if !uw.sent() && r.Context().Err() == nil {
			// A JSON answer is held whole: nothing went out yet.
			s.m.errors.WithLabelValues(s.o.KVConnector, stageDecode).Inc()
			s.log.Warn("model server answer cut short", "err", err, "request_id", id)
			writeError(w, newError(http.StatusBadGateway, "the decode node's answer was cut short: %v", err))
			return
		}
		s.abortResponse(r, stageDecode, err)
	}
	if err := uw.finish(); err != nil {
		s.abortResponse(r, stageDecode, err)
	}
}

// errBadLeg marks a decode leg that could not be built.
var errBadLeg = errors.New("building the decode leg")

// sendDecode posts the buffered decode leg b to the local model server;
// a stale keep-alive connection is retried by the transport (staleRetry).
func (s *Server) sendDecode(r *http.Request, id string, b body) (*http.Response, error) {
	req, err := newLeg(r.Context(), r, s.decoder.String()+r.URL.RequestURI(), id, b.marshal())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadLeg, err)
	}
	return s.decodeC.Do(req)
}

// handedOff counts a request whose prefill leg succeeded on prefiller.
func (s *Server) handedOff(prefiller string) {
	s.m.disagg.WithLabelValues(s.o.KVConnector).Inc()
	s.m.pairs.WithLabelValues(s.prefillers.label(prefiller)).Inc()
}

// maxPrefillerLabels bounds the prefiller label's values: a pool's
// members, many pods' worth of rollouts, but not the targets a client
// may name when SSRF protection is off (each a series kept for good).
const maxPrefillerLabels = endpoints.DefaultMaxEndpoints

// otherPrefiller is the label of the prefillers past maxPrefillerLabels.
const otherPrefiller = "other"

// labelSet hands out a label's values, the first max distinct ones as
// they are and every later one as otherPrefiller.
type labelSet struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

func (l *labelSet) label(v string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.max {
		return otherPrefiller
	}
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	l.seen[v] = struct{}{}
	return v
}
