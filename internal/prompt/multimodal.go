package prompt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	// Identifier stands for vLLM's mm_hash: SHA-256 of the model and the
	// part's media reference (its URL, or the inline data), in hex. Two
	// requests naming the same media get the same identifier, so their
	// placeholder blocks share KV and the encoder's output is reused.
	Identifier string
}

// MMParts lists a chat request's multimodal parts in prompt order.
func MMParts(req *openai.Request) []MMPart {
	if req.API != openai.ChatCompletions {
		return nil
	}
	var out []MMPart
	for _, m := range req.Messages {
		for _, p := range contentParts(m.Content) {
			if part, ok := mmPart(req.Model, p); ok {
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

func mmPart(model string, p map[string]json.RawMessage) (MMPart, bool) {
	var typ string
	_ = json.Unmarshal(p["type"], &typ)
	switch typ {
	case "image_url", "audio_url", "video_url":
		var u struct {
			URL string `json:"url"`
		}
		_ = json.Unmarshal(p[typ], &u)
		return MMPart{Kind: typ, Identifier: mmHash(model, typ, u.URL)}, true
	case "input_audio":
		var a struct {
			Data   string `json:"data"`
			Format string `json:"format"`
		}
		_ = json.Unmarshal(p[typ], &a)
		return MMPart{Kind: typ, Identifier: mmHash(model, typ, a.Format+":"+a.Data)}, true
	}
	return MMPart{}, false
}

func mmHash(model, kind, ref string) string {
	sum := sha256.Sum256([]byte(model + "\x00" + kind + "\x00" + ref))
	return hex.EncodeToString(sum[:])
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
