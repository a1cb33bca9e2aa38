package prompt

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// DefaultTokensPerItem is how many placeholder tokens one multimodal item
// takes in the prompt when the caller does not say: a fixed stand-in for
// what a vision or audio processor derives from the media's size.
const DefaultTokensPerItem = 256

// Placeholders as Qwen's vision-language chat templates write them: an
// item's pad token between vision_start and vision_end, repeated by the
// processor to the item's token count. Audio items use the image pad (the
// Qwen3 vocabulary has no audio pad).
const (
	visionStart = "<|vision_start|>"
	visionEnd   = "<|vision_end|>"
	imagePad    = "<|image_pad|>"
	videoPad    = "<|video_pad|>"
)

// MMPart is one multimodal content part of a chat request.
type MMPart struct {
	// Kind is the part type: image_url, audio_url, video_url or input_audio.
	Kind string
	// Identifier is the item's mm_hash, the extra key of its blocks and
	// the key of its encoder output (see mmIdentifier).
	Identifier string
}

// MMParts lists a chat request's multimodal parts in prompt order.
func MMParts(req *openai.Request) []MMPart {
	if req.API != openai.ChatCompletions {
		return nil
	}
	kwargs := req.RawField("mm_processor_kwargs")
	var out []MMPart
	for _, m := range req.Messages {
		for _, p := range contentParts(m.Content) {
			if part, ok := mmPart(req.Model, kwargs, p); ok {
				out = append(out, part)
			}
		}
	}
	return out
}

func contentParts(raw json.RawMessage) []map[string]json.RawMessage {
	var parts []map[string]json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return nil
	}
	return parts
}

// modalities are vLLM's modality of each part type: input_audio and
// audio_url items of the same content are the same item.
var modalities = map[string]string{"image_url": "image", "audio_url": "audio", "input_audio": "audio", "video_url": "video"}

func mmPart(model string, kwargs json.RawMessage, p map[string]json.RawMessage) (MMPart, bool) {
	var typ string
	_ = json.Unmarshal(p["type"], &typ)
	modality, ok := modalities[typ]
	if !ok {
		return MMPart{}, false
	}
	var uuid string
	_ = json.Unmarshal(p["uuid"], &uuid)
	var src mmSource
	if typ == "input_audio" {
		var a struct {
			Data string `json:"data"`
		}
		_ = json.Unmarshal(p[typ], &a)
		src = mmSource{content: base64Content(a.Data), raw: a.Data}
	} else {
		var u struct {
			URL string `json:"url"`
		}
		// A bare string (vLLM's simple form, {"image_url": "https://..."}) too.
		if json.Unmarshal(p[typ], &u) != nil {
			_ = json.Unmarshal(p[typ], &u.URL)
		}
		src = urlSource(u.URL)
	}
	return MMPart{Kind: typ, Identifier: mmIdentifier(model, modality, uuid, kwargs, src)}, true
}

// mmSource is what an item's identifier is taken from when it has no
// uuid: its decoded content, or (content nil) the reference as written.
type mmSource struct {
	content io.Reader
	raw     string
}

// mmIdentifier is an item's mm_hash, as vLLM keys its blocks and its
// encoder output:
//   - a content part's "uuid" (vLLM ≥ 0.11: the user vouches that it names
//     the media) is the identifier verbatim, as vLLM takes it when the
//     request has no mm_processor_kwargs; with them, a hash of the uuid and
//     the kwargs, since they change what the processor makes of the media;
//   - an inline item (a data: URL, input_audio's base64 data) is hashed by
//     its decoded bytes, so that the same media sent twice, however its
//     data URL is spelled, is one item;
//   - a remote URL is hashed as written: the router must not fetch it
//     (SSRF, and latency on the routing path), so two URLs of one image
//     are two items (a cache miss, never a wrong hit) and a URL whose
//     content changes keeps its identifier (the server would then reuse
//     the old encoder output for it, as any URL-keyed cache would).
//
// Content and URL hashes are SHA-256 over the model, the modality, the
// kwargs and the source, hex: they match between kvgate's picker and its
// simulator, not vLLM's own pixel-level hashes, which need the decoded
// media. Every field but the last is length-prefixed, so that no request
// can spell another's fields in one of its own (content ending in the
// bytes of some kwargs, a model name holding a modality) and share its
// identifier.
func mmIdentifier(model, modality, uuid string, kwargs json.RawMessage, src mmSource) string {
	hasKwargs := len(kwargs) > 0 && string(kwargs) != "null" && string(kwargs) != "{}"
	if uuid != "" && !hasKwargs {
		return uuid
	}
	if !hasKwargs {
		kwargs = nil
	}
	h := sha256.New()
	head := func(kind string) {
		for _, f := range []string{model, modality, kind, string(kwargs)} {
			var n [binary.MaxVarintLen64]byte
			h.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
			io.WriteString(h, f)
		}
	}
	switch {
	case uuid != "":
		head("uuid")
		io.WriteString(h, uuid)
	case src.content != nil:
		head("content")
		if _, err := io.Copy(h, src.content); err != nil {
			// Not valid base64: the server refuses the item; the router
			// still gives it a stable identifier, from what was written.
			h.Reset()
			head("ref")
			io.WriteString(h, src.raw)
		}
	default:
		head("ref")
		io.WriteString(h, src.raw)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// urlSource reads a media URL: a data: URL's decoded payload (RFC 2397:
// base64 when its parameters end in ;base64, percent-encoded otherwise),
// or any other URL as written.
func urlSource(u string) mmSource {
	rest, ok := cutPrefixFold(u, "data:")
	if !ok {
		return mmSource{raw: u}
	}
	meta, data, ok := strings.Cut(rest, ",")
	if !ok {
		return mmSource{raw: u}
	}
	if m := strings.ToLower(meta); strings.HasSuffix(m, ";base64") {
		return mmSource{content: base64Content(data), raw: u}
	}
	dec, err := url.PathUnescape(data)
	if err != nil {
		return mmSource{raw: u}
	}
	return mmSource{content: strings.NewReader(dec), raw: u}
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// base64Content decodes standard base64, padded or not, streaming: an
// image of megabytes is hashed without a decoded copy. Whitespace (line
// breaks in long payloads) is skipped, as Python's decoder does.
func base64Content(data string) io.Reader {
	clean := data
	if strings.ContainsAny(data, "\n\r\t ") {
		clean = strings.NewReplacer("\n", "", "\r", "", " ", "", "\t", "").Replace(data)
	}
	enc := base64.StdEncoding
	if len(clean)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	return base64.NewDecoder(enc, strings.NewReader(clean))
}

// TokensMM is Tokens for prompts that may hold multimodal parts: each part
// becomes tokensPerItem placeholder tokens where it stands in its message,
// and the items' places come back for the block hashes (kvhash.Extra.MM).
// A prompt without such parts is exactly Tokens'.
func TokensMM(enc Encoder, tmpl Templater, req *openai.Request, tokensPerItem int) ([]int, []kvhash.MMItem, error) {
	parts := MMParts(req)
	if len(parts) == 0 {
		ids, err := Tokens(enc, tmpl, req)
		return ids, nil, err
	}
	if tokensPerItem < 1 {
		return nil, nil, fmt.Errorf("multimodal: %d tokens per item", tokensPerItem)
	}
	msgs := make([]tokenizer.Message, len(req.Messages))
	for i, m := range req.Messages {
		parts := contentParts(m.Content)
		if parts == nil {
			msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Text()}
			continue
		}
		var b strings.Builder
		for _, p := range parts {
			var typ, text string
			_ = json.Unmarshal(p["type"], &typ)
			switch typ {
			case "text":
				_ = json.Unmarshal(p["text"], &text)
				b.WriteString(text)
			case "video_url":
				b.WriteString(visionStart + videoPad + visionEnd)
			case "image_url", "audio_url", "input_audio":
				b.WriteString(visionStart + imagePad + visionEnd)
			}
		}
		msgs[i] = tokenizer.Message{Role: m.Role, Content: b.String()}
	}
	text, err := tmpl.ApplyChatTemplate(msgs, true)
	if err != nil {
		return nil, nil, fmt.Errorf("rendering chat template: %w", err)
	}
	pads := map[int]bool{}
	for _, p := range []string{imagePad, videoPad} {
		ids := enc.Encode(p)
		if len(ids) != 1 {
			return nil, nil, fmt.Errorf("multimodal: the tokenizer has no %s token", p)
		}
		pads[ids[0]] = true
	}
	raw := enc.Encode(text)
	out := make([]int, 0, len(raw)+len(parts)*(tokensPerItem-1))
	items := make([]kvhash.MMItem, 0, len(parts))
	for _, id := range raw {
		if !pads[id] || len(items) == len(parts) {
			out = append(out, id)
			continue
		}
		items = append(items, kvhash.MMItem{Identifier: parts[len(items)].Identifier, Offset: len(out), Length: tokensPerItem})
		for range tokensPerItem {
			out = append(out, id)
		}
	}
	if len(items) != len(parts) {
		return nil, nil, fmt.Errorf("multimodal: %d of %d items found in the rendered prompt", len(items), len(parts))
	}
	return out, items, nil
}
