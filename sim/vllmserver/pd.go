package vllmserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/sim/engine"
)

// applyTransfer turns a request's kv_transfer_params into the engine's
// P/D mode.
func (s *Server) applyTransfer(j *job) *apiError {
	kv := j.kv
	if kv == nil {
		return nil
	}
	switch {
	case kv.DoRemoteDecode && kv.DoRemotePrefill:
		return badRequest("kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive")
	case kv.DoRemoteDecode && s.opts.Role == RoleDecode:
		return badRequest("kv_transfer_params: this server's role is decode; it does not serve prefill legs (do_remote_decode)")
	case kv.DoRemotePrefill && s.opts.Role == RolePrefill:
		return badRequest("kv_transfer_params: this server's role is prefill; it does not serve decode legs (do_remote_prefill)")
	}
	if (kv.RemoteDecoder != nil || kv.RemotePrefiller != nil) && (s.kvc == nil || s.kvc.tier == nil) {
		return badRequest("kv_transfer_params: remote_decoder and remote_prefiller need --kv-transfer-config kv_connector %s", ConnectorOffloading)
	}
	j.prefillOnly = kv.DoRemoteDecode
	if kv.DoRemotePrefill {
		// The prefiller holds the KV of the blocks it names; the engine
		// pulls what it lacks and caps the count at the prompt.
		j.remote = &engine.RemotePrefill{Tokens: len(kv.RemoteBlockIDs) * s.engCfg.BlockSize}
	}
	return nil
}

// transferParams is the prefill leg's answer: where the decoder finds the
// KV. remote_host and remote_port are this server's HTTP address, which
// also serves /kvgate/release_kv.
func (s *Server) transferParams(j *job, fin *engine.Finished) *vllm.KVTransferParams {
	if !j.prefillOnly || fin.Transfer == nil {
		return nil
	}
	if s.dp != nil {
		return s.dp.prefillParams(j)
	}
	id, eng, host, port, tp := j.id, s.engID, s.host, s.port, 1
	return &vllm.KVTransferParams{
		DoRemotePrefill: true, RemoteEngineID: &eng, RemoteBlockIDs: fin.Transfer.BlockIDs,
		RemoteRequestID: &id, RemoteHost: &host, RemotePort: &port, TPSize: &tp,
	}
}

// releaseTimeout bounds one release_kv call whole.
const releaseTimeout = 5 * time.Second

type releaseRequest struct {
	RequestID string `json:"request_id"`
}

// releaseKV is POST /kvgate/release_kv {"request_id": ...}: a decoder has
// pulled a prefill's KV, so its blocks may go.
func (s *Server) releaseKV(w http.ResponseWriter, r *http.Request) {
	var req releaseRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || req.RequestID == "" {
		writeError(w, badRequest("want a JSON body {\"request_id\": \"...\"}"))
		return
	}
	if err := s.runner.Release(req.RequestID); err != nil {
		if errors.Is(err, engine.ErrUnknownRequest) {
			writeError(w, newAPIError(http.StatusNotFound, "no held KV blocks for request %q", req.RequestID))
			return
		}
		writeError(w, newAPIError(http.StatusInternalServerError, "%v", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"request_id": req.RequestID, "released": true})
}

// releaseRemote tells a decode leg's prefiller that its KV has been pulled,
// in the background and best effort: if it fails, or too many are in
// flight, the prefiller's held-block timeout frees the blocks.
func (s *Server) releaseRemote(kv *vllm.KVTransferParams) {
	// With an agent, the pull's NIXL notification frees the prefiller.
	if s.dp != nil || kv == nil || !kv.DoRemotePrefill || kv.RemoteHost == nil || kv.RemotePort == nil ||
		kv.RemoteRequestID == nil || *kv.RemoteHost == "" {
		return
	}
	// Refused, it is left to the prefiller's held-block timeout, as a
	// release that failed: the request itself has its tokens.
	if s.peers.check(dialReleaseKV, "remote_host", *kv.RemoteHost) != nil {
		return
	}
	url := "http://" + net.JoinHostPort(*kv.RemoteHost, strconv.Itoa(*kv.RemotePort)) + "/kvgate/release_kv"
	body, _ := json.Marshal(releaseRequest{RequestID: *kv.RemoteRequestID})
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.relClosed {
		return
	}
	select {
	case s.relSem <- struct{}{}:
	default:
		s.log.Debug("too many KV release calls in flight; leaving it to the prefiller's timeout", "url", url)
		return
	}
	s.relWG.Go(func() {
		defer func() { <-s.relSem }()
		if err := s.postRelease(s.ctx, url, body); err != nil {
			s.log.Debug("KV release failed; the prefiller's timeout will free the blocks", "url", url, "err", err)
		}
	})
}

func (s *Server) postRelease(ctx context.Context, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// resetPrefixCache is vLLM's POST /reset_prefix_cache.
func (s *Server) resetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	if err := s.runner.ResetPrefixCache(); err != nil {
		if errors.Is(err, engine.ErrCacheInUse) {
			writeError(w, newAPIError(http.StatusConflict, "%v", err))
			return
		}
		writeError(w, newAPIError(http.StatusInternalServerError, "%v", err))
		return
	}
	w.WriteHeader(http.StatusOK)
}
