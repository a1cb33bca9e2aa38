package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// maxEncodeItems bounds the encoder requests one chat request fans out to.
const maxEncodeItems = 64

var errEncoderFailed = errors.New("an encoder failed")

// mmPartTypes are the content-part types the encode stage serves; the URL
// kinds are de-duplicated by URL, as llm-d's sidecar does.
var mmPartTypes = map[string]bool{"image_url": true, "audio_url": true, "video_url": true, "input_audio": true}

// mmItems are the multimodal content parts of a chat body's messages, in
// order, each URL once.
func mmItems(b body) ([]json.RawMessage, error) {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b["messages"], &msgs); err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	seen := map[string]bool{}
	var items []json.RawMessage
	for _, m := range msgs {
		var parts []json.RawMessage
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // a string content has no parts
		}
		for _, p := range parts {
			var head map[string]json.RawMessage
			if json.Unmarshal(p, &head) != nil {
				continue
			}
			var typ string
			_ = json.Unmarshal(head["type"], &typ)
			if !mmPartTypes[typ] {
				continue
			}
			if typ != "input_audio" {
				var u struct {
					URL string `json:"url"`
				}
				_ = json.Unmarshal(head[typ], &u)
				key := typ + "\x00" + u.URL
				if u.URL != "" && seen[key] {
					continue
				}
				seen[key] = true
			}
			if len(items) == maxEncodeItems {
				return nil, fmt.Errorf("more than %d multimodal items", maxEncodeItems)
			}
			items = append(items, p)
		}
	}
	return items, nil
}

// encode is the E/P/D encode stage: one request per multimodal item, all
// at once, round-robin over the encoders; each a copy of the chat request
// whose only message holds that item, capped to one token. The first
// failure cancels the others and is the client's answer. With ec-nixl the
// encoders' ec_transfer_params (keyed by multimodal hash) are merged into
// one object for the next stage; ec-example (shared storage) passes
// nothing. ok is false when the client has its answer.
func (s *Server) encode(w http.ResponseWriter, r *http.Request, b body, id string, encoders []string) (json.RawMessage, bool) {
	items, err := mmItems(b)
	if err != nil {
		writeError(w, newError(http.StatusBadRequest, "%v", err))
		return nil, false
	}
	if len(items) == 0 {
		return nil, true
	}
	start := time.Now()
	defer func() { s.m.encode.WithLabelValues(s.o.ECConnector).Observe(time.Since(start).Seconds()) }()
	g, ctx := errgroup.WithContext(r.Context())
	results := make([]*legResult, len(items))
	var (
		failOnce sync.Once
		failed   *legResult
		failErr  *apiError
	)
	fail := func(res *legResult, aerr *apiError) error {
		failOnce.Do(func() { failed, failErr = res, aerr })
		return errEncoderFailed
	}
	for i, item := range items {
		leg := b.clone()
		leg.set("messages", []map[string]any{{"role": "user", "content": []json.RawMessage{item}}})
		leg.capSingleToken(apis[0])
		target := s.prefix[stageEncoder] + encoders[i%len(encoders)] + apis[0].path
		legID := id + "-enc-" + strconv.Itoa(i)
		g.Go(func() error {
			res, aerr := s.send(ctx, s.encodeC, r, target, legID, leg.marshal(), 0)
			switch {
			case aerr != nil:
				return fail(nil, aerr)
			case !res.ok():
				return fail(res, nil)
			}
			results[i] = res
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		s.m.errors.WithLabelValues(s.o.ECConnector, stageEncode).Inc()
		s.log.Warn("encode stage failed", "request_id", id)
		switch {
		case r.Context().Err() != nil:
		case failed != nil:
			failed.writeTo(w)
		default:
			writeError(w, failErr)
		}
		return nil, false
	}
	if s.o.ECConnector != ECConnectorNIXL {
		return nil, true
	}
	merged := map[string]json.RawMessage{}
	for _, res := range results {
		var ans struct {
			EC map[string]json.RawMessage `json:"ec_transfer_params"`
		}
		if err := json.Unmarshal(res.body, &ans); err != nil {
			writeError(w, newError(http.StatusBadGateway, "encoder answer is not JSON: %v", err))
			return nil, false
		}
		for k, v := range ans.EC {
			merged[k] = v
		}
	}
	if len(merged) == 0 {
		return nil, true
	}
	out, _ := json.Marshal(merged)
	return out, true
}
