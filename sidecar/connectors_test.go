package sidecar

import (
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// TestOffloading: both legs at once; the prefill leg names the decoder's
// pull id, the decode leg the prefiller's p2p tier; the decode answer is
// not rewritten.
func TestOffloading(t *testing.T) {
	pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
	dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) {
		writeJSONReply(w, http.StatusOK, map[string]any{"usage": map[string]any{"prompt_tokens_details": map[string]any{"cached_tokens": 5.0}}})
	})
	src := newRecorder(t, nil) // a KV source: named, never dialled by the sidecar
	o := testOptions(dec.port(), poolFile(t, pre.addr(), src.addr()))
	o.KVConnector, o.P2PConnectorPort = ConnectorOffloading, 7790
	_, url := startSidecar(t, o)
	body := map[string]any{"model": "m", "prompt": "p", "max_tokens": 8.0, "max_completion_tokens": 8.0, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: pre.addr(), eppwire.HeaderKVCacheSource: src.addr()}, body)
	if st != http.StatusOK || !strings.Contains(string(raw), `"cached_tokens":5`) {
		t.Fatalf("%d %s", st, raw)
	}
	deadline := time.Now().Add(testTimeout)
	for len(pre.got()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p, d := pre.got(), dec.got()
	if len(p) != 1 || len(d) != 1 || len(src.got()) != 0 {
		t.Fatalf("legs %d %d, source dialled %d", len(p), len(d), len(src.got()))
	}
	id := d[0].Header.Get("X-Request-Id")
	wantPre := map[string]any{"remote_decoder": map[string]any{"kv_request_id": id},
		"remote_kv_source": map[string]any{"kv_request_id": id, "remote_host": "127.0.0.1", "remote_port": 7790.0}}
	if !reflect.DeepEqual(p[0].Body["kv_transfer_params"], wantPre) || p[0].Body["max_tokens"] != 1.0 || p[0].Body["stream"] != false {
		t.Fatalf("prefill leg %v", p[0].Body)
	}
	wantDec := map[string]any{"remote_prefiller": map[string]any{"kv_request_id": id, "remote_host": "127.0.0.1", "remote_port": 7790.0}}
	if !reflect.DeepEqual(d[0].Body["kv_transfer_params"], wantDec) || d[0].Body["max_tokens"] != 8.0 || d[0].Body["stream"] != true {
		t.Fatalf("decode leg %v", d[0].Body)
	}
}

// TestSharedStorage: with cache_hit_threshold the decoder is tried first;
// "cache_threshold" sends the request through the prefiller, then decodes
// with threshold 0; a decoder with enough cache answers directly.
func TestSharedStorage(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stream      bool
		threshold   bool
		decoderHits bool // the first decode attempt meets the threshold
		wantPrefill int
		wantDecode  int
	}{
		{"no threshold", false, false, false, 1, 1},
		{"threshold met", false, true, true, 0, 1},
		{"threshold missed", false, true, false, 1, 2},
		{"threshold missed, stream", true, true, false, 1, 2},
		{"threshold met, stream", true, true, true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, map[string]any{}) })
			dec := newRecorder(t, func(w http.ResponseWriter, _ int, l leg) {
				reason := "length"
				if l.Body["cache_hit_threshold"] != 0.0 && !tc.decoderHits {
					reason = "cache_threshold"
				}
				if tc.stream {
					// A decoder below the threshold generates nothing: its first
					// chunk is the finish.
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, ": keep-alive\n\n")
					if reason == "length" {
						fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n")
					}
					fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":%q}]}\n\ndata: [DONE]\n\n", reason)
					return
				}
				writeJSONReply(w, http.StatusOK, map[string]any{"choices": []any{map[string]any{"text": "abc", "finish_reason": reason}}})
			})
			o := testOptions(dec.port(), poolFile(t, pre.addr()))
			o.KVConnector = ConnectorSharedStorage
			_, url := startSidecar(t, o)
			body := map[string]any{"model": "m", "prompt": "p", "max_tokens": 4.0, "stream": tc.stream}
			if tc.threshold {
				body["cache_hit_threshold"] = 0.8
			}
			st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: pre.addr()}, body)
			if st != http.StatusOK || strings.Contains(string(raw), "cache_threshold") {
				t.Fatalf("%d %s", st, raw)
			}
			p, d := pre.got(), dec.got()
			if len(p) != tc.wantPrefill || len(d) != tc.wantDecode {
				t.Fatalf("%d prefill legs, %d decode legs", len(p), len(d))
			}
			if len(p) == 1 && (p[0].Body["cache_hit_threshold"] != 0.0 || p[0].Body["max_tokens"] != 1.0) {
				t.Fatalf("prefill leg %v", p[0].Body)
			}
			if last := d[len(d)-1]; tc.wantPrefill == 1 && last.Body["cache_hit_threshold"] != 0.0 {
				t.Fatalf("final decode leg %v", last.Body)
			}
		})
	}
}

// TestP2PPull: a decode-only request with a KV source gets its
// kv_transfer_params rebuilt as one remote_kv_source pull, with nixlv2
// only under --enable-p2p-pull; no pull from the pod itself.
func TestP2PPull(t *testing.T) {
	dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, map[string]any{}) })
	src := newRecorder(t, nil)
	for _, tc := range []struct {
		name   string
		pull   bool
		podIP  string
		inject bool
	}{
		{"pull on", true, "", true},
		{"pull off", false, "", false},
		{"source is this pod", true, "127.0.0.1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_IP", tc.podIP)
			o := testOptions(dec.port(), poolFile(t, src.addr()))
			o.EnableP2PPull = tc.pull
			_, url := startSidecar(t, o)
			before := len(dec.got())
			body := map[string]any{"model": "m", "prompt": "p", "kv_transfer_params": map[string]any{"client": "junk"}}
			if st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderKVCacheSourceLLMD: src.addr()}, body); st != http.StatusOK {
				t.Fatalf("%d %s", st, raw)
			}
			l := dec.got()[before]
			kv, _ := l.Body["kv_transfer_params"].(map[string]any)
			if tc.inject {
				want := map[string]any{"remote_kv_source": map[string]any{"kv_request_id": l.Header.Get("X-Request-Id"), "remote_host": "127.0.0.1", "remote_port": 7777.0}}
				if !reflect.DeepEqual(kv, want) {
					t.Fatalf("kv_transfer_params %v", kv)
				}
			} else if kv["client"] != "junk" || len(kv) != 1 {
				t.Fatalf("kv_transfer_params %v: want the client's, untouched", kv)
			}
			if l.Header.Get(eppwire.HeaderKVCacheSourceLLMD) != "" || len(src.got()) != 0 {
				t.Fatal("the source header reached the decoder, or the source was dialled")
			}
		})
	}
}

// TestEncoderFanOut: one encoder request per multimodal item (URLs
// de-duplicated), round-robin over the encoders, each a one-item,
// one-token chat; ec_transfer_params merged into the prefill leg; the
// first failure is the client's answer.
func TestEncoderFanOut(t *testing.T) {
	item := func(typ, url string) map[string]any {
		return map[string]any{"type": typ, typ: map[string]any{"url": url}}
	}
	chat := map[string]any{"model": "m", "max_tokens": 30.0, "stream": true, "messages": []any{
		map[string]any{"role": "system", "content": "be brief"},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "compare"},
			item("image_url", "http://x/a.png"), item("image_url", "http://x/b.png"), item("audio_url", "http://x/c.wav")}},
		map[string]any{"role": "user", "content": []any{item("image_url", "http://x/a.png"), item("video_url", "http://x/d.mp4")}},
	}}
	var fail atomic.Bool
	encAnswer := func(w http.ResponseWriter, _ int, l leg) {
		msgs := l.Body["messages"].([]any)
		part := msgs[0].(map[string]any)["content"].([]any)[0].(map[string]any)
		url := part[part["type"].(string)].(map[string]any)["url"].(string)
		if fail.Load() && strings.HasSuffix(url, ".wav") {
			writeJSONReply(w, http.StatusBadRequest, map[string]any{"object": "error", "message": "bad audio", "code": 400})
			return
		}
		writeJSONReply(w, http.StatusOK, map[string]any{"ec_transfer_params": map[string]any{"mm-" + url: map[string]any{"size_bytes": 10.0}}})
	}
	enc1, enc2 := newRecorder(t, encAnswer), newRecorder(t, encAnswer)
	pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
	dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, map[string]any{}) })
	o := testOptions(dec.port(), poolFile(t, enc1.addr(), enc2.addr(), pre.addr()))
	o.ECConnector = ECConnectorNIXL
	_, url := startSidecar(t, o)
	hdr := map[string]string{eppwire.HeaderPrefiller: pre.addr(), eppwire.HeaderEncoders: enc1.addr() + ", " + enc2.addr()}
	if st, _, raw := post(t, url+"/v1/chat/completions", hdr, chat); st != http.StatusOK {
		t.Fatalf("%d %s", st, raw)
	}
	legs := append(enc1.got(), enc2.got()...)
	if len(enc1.got()) != 2 || len(enc2.got()) != 2 {
		t.Fatalf("encoder legs %d + %d, want 2 + 2 (4 distinct items, round-robin)", len(enc1.got()), len(enc2.got()))
	}
	var ids []string
	for _, l := range legs {
		msgs := l.Body["messages"].([]any)
		if len(msgs) != 1 || len(msgs[0].(map[string]any)["content"].([]any)) != 1 || l.Body["max_tokens"] != 1.0 ||
			l.Body["stream"] != false || l.Path != "/v1/chat/completions" {
			t.Fatalf("encoder leg %v", l.Body)
		}
		ids = append(ids, l.Header.Get("X-Request-Id"))
	}
	sort.Strings(ids)
	base := strings.TrimSuffix(ids[0], "-enc-0")
	for i, id := range ids {
		if id != fmt.Sprintf("%s-enc-%d", base, i) {
			t.Fatalf("encoder request ids %v", ids)
		}
	}
	ec, _ := pre.got()[0].Body["ec_transfer_params"].(map[string]any)
	if len(ec) != 4 || ec["mm-http://x/d.mp4"] == nil {
		t.Fatalf("prefill ec_transfer_params %v", ec)
	}
	if _, ok := dec.got()[0].Body["ec_transfer_params"]; ok {
		t.Fatal("the decode leg carries ec_transfer_params; the prefill leg consumed them")
	}

	fail.Store(true)
	st, _, raw := post(t, url+"/v1/chat/completions", hdr, chat)
	if st != http.StatusBadRequest || !strings.Contains(string(raw), "bad audio") || len(pre.got()) != 1 {
		t.Fatalf("failing encoder: %d %s, %d prefill legs", st, raw, len(pre.got()))
	}
}
