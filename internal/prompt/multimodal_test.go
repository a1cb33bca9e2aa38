package prompt

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
)

// chatWith is a chat request whose one user message holds parts, with
// top-level fields extra merged in.
func chatWith(t testing.TB, model string, extra map[string]any, parts ...any) *openai.Request {
	t.Helper()
	body := map[string]any{"model": model, "messages": []any{map[string]any{"role": "user", "content": parts}}}
	for k, v := range extra {
		body[k] = v
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := openai.Parse(openai.ChatCompletions, raw)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func image(u string) map[string]any {
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}}
}

func withUUID(p map[string]any, id string) map[string]any {
	p["uuid"] = id
	return p
}

// identifier is the one multimodal part's identifier.
func identifier(t testing.TB, req *openai.Request) string {
	t.Helper()
	parts := MMParts(req)
	if len(parts) != 1 {
		t.Fatalf("%d multimodal parts, want 1", len(parts))
	}
	return parts[0].Identifier
}

// TestMMIdentifier: a part's uuid wins; inline media is identified by its
// decoded content, whatever the spelling of its data URL; a remote URL by
// the URL as written, never fetched.
func TestMMIdentifier(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\n fake pixels \x00\x01\x02")
	b64 := base64.StdEncoding.EncodeToString(png)
	raw := base64.RawStdEncoding.EncodeToString(png)
	id := func(parts ...any) string { return identifier(t, chatWith(t, "m", nil, parts...)) }
	same := []struct {
		name string
		a, b string
	}{
		{"uuid verbatim", id(withUUID(image("https://a.example/x.png"), "sku-42")), "sku-42"},
		{"uuid wins over the URL", id(withUUID(image("https://a.example/x.png"), "u1")), id(withUUID(image("https://b.example/y.png"), "u1"))},
		{"uuid wins over the content", id(withUUID(image("data:image/png;base64,"+b64), "u2")), id(withUUID(image("https://b.example/y.png"), "u2"))},
		{"data URL by content: media type ignored", id(image("data:image/png;base64," + b64)), id(image("data:image/jpeg;base64," + b64))},
		{"data URL by content: padding and line breaks", id(image("data:image/png;base64," + b64)), id(image("DATA:image/png;BASE64," + raw[:10] + "\n" + raw[10:]))},
		{"data URL by content: percent-encoded", id(image("data:," + url.PathEscape(string(png)))), id(image("data:text/plain;charset=utf-8," + url.PathEscape(string(png))))},
		{"input_audio and audio_url of one content", id(map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": b64, "format": "wav"}}),
			id(map[string]any{"type": "audio_url", "audio_url": map[string]any{"url": "data:audio/wav;base64," + b64}})},
		{"URL as written, simple form too", id(image("https://a.example/x.png")), id(map[string]any{"type": "image_url", "image_url": "https://a.example/x.png"})},
	}
	for _, tc := range same {
		if tc.a != tc.b || tc.a == "" {
			t.Errorf("%s: %q and %q, want one identifier", tc.name, tc.a, tc.b)
		}
	}
	differ := []struct {
		name string
		a, b string
	}{
		{"two uuids", id(withUUID(image("https://a.example/x.png"), "u1")), id(withUUID(image("https://a.example/x.png"), "u2"))},
		{"two contents", id(image("data:image/png;base64," + b64)), id(image("data:image/png;base64," + base64.StdEncoding.EncodeToString(append(png, 9))))},
		{"two URLs of one image", id(image("https://a.example/x.png")), id(image("https://a.example/x.png?v=2"))},
		{"a URL and its content", id(image("https://a.example/x.png")), id(image("data:image/png;base64," + b64))},
		{"image and audio of one content", id(image("data:image/png;base64," + b64)), id(map[string]any{"type": "audio_url", "audio_url": map[string]any{"url": "data:audio/wav;base64," + b64}})},
		{"uuid and a URL spelling it", id(withUUID(image("https://a.example/x.png"), "u1")), id(image("u1"))},
	}
	for _, tc := range differ {
		if tc.a == tc.b {
			t.Errorf("%s: both %q, want two identifiers", tc.name, tc.a)
		}
	}
	// The model and the processor kwargs change what the media becomes.
	u := withUUID(image("https://a.example/x.png"), "u1")
	if a, b := identifier(t, chatWith(t, "m1", nil, image("data:,x"))), identifier(t, chatWith(t, "m2", nil, image("data:,x"))); a == b {
		t.Error("two models share an identifier")
	}
	kw := identifier(t, chatWith(t, "m", map[string]any{"mm_processor_kwargs": map[string]any{"max_pixels": 1024}}, u))
	if kw == "u1" || kw == identifier(t, chatWith(t, "m", map[string]any{"mm_processor_kwargs": map[string]any{"max_pixels": 2048}}, u)) {
		t.Errorf("with mm_processor_kwargs the uuid is hashed with them: %q", kw)
	}
	// Each field is delimited, so no one request's fields run into
	// another's: content ending in the kwargs' bytes is not the content
	// with those kwargs, nor a model whose name spells a modality and
	// content another model's item.
	kwargs := map[string]any{"mm_processor_kwargs": map[string]any{"max_pixels": 1024}}
	if a, b := identifier(t, chatWith(t, "m", kwargs, image("data:,pixels"))),
		identifier(t, chatWith(t, "m", nil, image("data:,"+url.PathEscape(`pixels{"max_pixels":1024}`)))); a == b {
		t.Errorf("content with kwargs and content spelling them: both %q", a)
	}
	if a, b := identifier(t, chatWith(t, "m", nil, image("data:,"+url.PathEscape("x\x00image\x00content\x00pixels")))),
		identifier(t, chatWith(t, "m\x00image\x00content\x00x", nil, image("data:,pixels"))); a == b {
		t.Errorf("a model name spelling another item: both %q", a)
	}
	// Bad base64 still gets a stable identifier (the server refuses it).
	bad := "data:image/png;base64,@@not base64@@"
	if a, b := id(image(bad)), id(image(bad)); a != b || a == id(image("data:image/png;base64,"+b64)) {
		t.Errorf("undecodable data URL: %q / %q", a, b)
	}
}

// FuzzMMParts: any chat body's multimodal parts are parsed without a
// panic, each with an identifier, the same one every time.
func FuzzMMParts(f *testing.F) {
	f.Add(`[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="},"uuid":"x"}]`, `{}`)
	f.Add(`[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]`, `null`)
	f.Add(`[{"type":"video_url","video_url":"data:;base64"},{"type":"audio_url","audio_url":{"url":"data:,%zz"}}]`, `{"fps":2}`)
	f.Fuzz(func(t *testing.T, content, kwargs string) {
		body := `{"model":"m","messages":[{"role":"user","content":` + content + `}],"mm_processor_kwargs":` + kwargs + `}`
		req, err := openai.Parse(openai.ChatCompletions, []byte(body))
		if err != nil {
			return
		}
		a, b := MMParts(req), MMParts(req)
		if len(a) != len(b) {
			t.Fatalf("%d then %d parts", len(a), len(b))
		}
		for i := range a {
			if a[i].Identifier == "" {
				t.Fatalf("part %d has no identifier: %s", i, body)
			}
			if a[i] != b[i] {
				t.Fatalf("part %d: %+v then %+v", i, a[i], b[i])
			}
		}
	})
}
