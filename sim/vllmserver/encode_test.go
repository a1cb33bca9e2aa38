package vllmserver

import (
	"encoding/json"
	"net/http"
	"testing"
)

func mmChat(model, text string, urls ...string) map[string]any {
	parts := []any{}
	for _, u := range urls {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}})
	}
	parts = append(parts, map[string]any{"type": "text", "text": text})
	return map[string]any{"model": model, "max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": parts}}}
}

type mmAnswer struct {
	Usage struct {
		Prompt  int `json:"prompt_tokens"`
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	EC map[string]ecParams `json:"ec_transfer_params"`
}

func mmPost(t *testing.T, s *Server, body map[string]any) mmAnswer {
	t.Helper()
	st, raw := post(t, s.URL()+"/v1/chat/completions", body)
	if st != http.StatusOK {
		t.Fatalf("%d %s", st, raw)
	}
	var a mmAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestMultimodalPrefixCache: an image's placeholder blocks hash with its
// multimodal hash (vLLM's extra keys), so the same image is a cache hit
// and another image in the same placeholders is not.
func TestMultimodalPrefixCache(t *testing.T) {
	o := testOptions(t)
	o.MMTokensPerItem = 64
	s := startServer(t, o)
	first := mmPost(t, s, mmChat(o.Model, "describe it", "http://img/cat.png"))
	if first.Usage.Prompt < 64 || first.Usage.Details.Cached != 0 {
		t.Fatalf("first: %+v", first.Usage)
	}
	same := mmPost(t, s, mmChat(o.Model, "describe it, in French", "http://img/cat.png"))
	other := mmPost(t, s, mmChat(o.Model, "describe it", "http://img/dog.png"))
	// The image starts after a few template tokens: the other image shares
	// at most the blocks before it.
	if same.Usage.Details.Cached < 64 || other.Usage.Details.Cached >= 16+16 {
		t.Fatalf("same image cached %d, other image cached %d", same.Usage.Details.Cached, other.Usage.Details.Cached)
	}
}

// TestEncodeRole: an encode server runs the encoder once per multimodal
// hash and names its outputs in ec_transfer_params; a prefill server
// given them runs no encoder; one without them does.
func TestEncodeRole(t *testing.T) {
	eo := testOptions(t)
	eo.Role, eo.MMTokensPerItem = RoleEncode, 32
	enc := startServer(t, eo)
	if st, _ := post(t, enc.URL()+"/v1/chat/completions", map[string]any{"model": eo.Model, "messages": []any{map[string]any{"role": "user", "content": "no image"}}}); st != http.StatusBadRequest {
		t.Fatalf("encode server took a text-only request: %d", st)
	}
	a := mmPost(t, enc, mmChat(eo.Model, "", "http://img/a.png"))
	if len(a.EC) != 1 {
		t.Fatalf("ec_transfer_params %v", a.EC)
	}
	for _, p := range a.EC {
		if p.PeerHost != "127.0.0.1" || p.PeerPort == 0 || p.SizeBytes != 32*enc.hidden*2 {
			t.Fatalf("ec descriptor %+v", p)
		}
	}
	mmPost(t, enc, mmChat(eo.Model, "", "http://img/a.png"))
	if h, m := enc.encCache.counts(); h != 1 || m != 1 {
		t.Fatalf("encoder cache: %d hits, %d runs; want one run, then a hit", h, m)
	}

	po := testOptions(t)
	po.MMTokensPerItem = 32
	pre := startServer(t, po)
	body := mmChat(po.Model, "what is it", "http://img/a.png", "http://img/b.png")
	body["ec_transfer_params"] = a.EC // a.png's output only
	mmPost(t, pre, body)
	if _, runs := pre.encCache.counts(); runs != 1 || pre.encoded.Load() != 1 {
		t.Fatalf("prefill server ran %d encoder passes, used %d remote outputs; want 1 and 1", runs, pre.encoded.Load())
	}
}

// TestEncoderKeyedByMMHash: the encode server keys its outputs by the
// item's mm_hash as vLLM takes it — a content part's uuid verbatim, or an
// inline image's decoded bytes — so one image under two URLs with one
// uuid, or under two spellings of its data URL, is encoded once, and its
// placeholder blocks are a prefix-cache hit.
func TestEncoderKeyedByMMHash(t *testing.T) {
	o := testOptions(t)
	o.Role, o.MMTokensPerItem = RoleEncode, 32
	enc := startServer(t, o)
	withUUID := func(body map[string]any, id string) map[string]any {
		parts := body["messages"].([]any)[0].(map[string]any)["content"].([]any)
		parts[0].(map[string]any)["uuid"] = id
		return body
	}
	a := mmPost(t, enc, withUUID(mmChat(o.Model, "", "https://cdn-1.example/cat.png"), "cat-v1"))
	if _, ok := a.EC["cat-v1"]; !ok || len(a.EC) != 1 {
		t.Fatalf("ec_transfer_params %v, want the output keyed by the uuid", a.EC)
	}
	mmPost(t, enc, withUUID(mmChat(o.Model, "", "https://cdn-2.example/cat.png"), "cat-v1"))
	if h, m := enc.encCache.counts(); h != 1 || m != 1 {
		t.Fatalf("one uuid under two URLs: %d hits, %d runs; want one run, then a hit", h, m)
	}
	const pixels = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
	b := mmPost(t, enc, mmChat(o.Model, "", "data:image/png;base64,"+pixels))
	c := mmPost(t, enc, mmChat(o.Model, "", "data:image/x-png;base64,"+pixels[:20]+"\n"+pixels[20:]))
	if h, m := enc.encCache.counts(); h != 2 || m != 2 || len(b.EC) != 1 || len(c.EC) != 1 {
		t.Fatalf("one data URL spelled twice: %d hits, %d runs (%v, %v); want a second run, then a hit", h, m, b.EC, c.EC)
	}
	for k := range b.EC {
		if _, ok := c.EC[k]; !ok {
			t.Fatalf("two spellings of one image: keys %v and %v", b.EC, c.EC)
		}
	}

	po := testOptions(t)
	po.MMTokensPerItem = 64
	s := startServer(t, po)
	mmPost(t, s, withUUID(mmChat(po.Model, "describe it", "https://cdn-1.example/cat.png"), "cat-v1"))
	hit := mmPost(t, s, withUUID(mmChat(po.Model, "describe it", "https://cdn-2.example/cat.png"), "cat-v1"))
	miss := mmPost(t, s, withUUID(mmChat(po.Model, "describe it", "https://cdn-1.example/cat.png"), "cat-v2"))
	if hit.Usage.Details.Cached < 64 || miss.Usage.Details.Cached >= 32 {
		t.Fatalf("same uuid cached %d tokens, another uuid %d", hit.Usage.Details.Cached, miss.Usage.Details.Cached)
	}
}
