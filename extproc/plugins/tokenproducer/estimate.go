package tokenproducer

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"strconv"
	"strings"

	// Decoders image.DecodeConfig reads data-URL images' sizes with.
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
)

// The estimate backend's built-in values (llm-d's).
const (
	bytesPerToken       = 4
	defaultWidth        = 640
	defaultHeight       = 360
	defaultFactor       = 1024
	defaultVideoSeconds = 10
	defaultSampleFPS    = 2
	defaultSourceFPS    = 24
	// anthropicBillingPrefix marks system text carrying a per-request
	// hash, which vLLM drops before rendering.
	anthropicBillingPrefix = "x-anthropic-billing-header"
)

// Estimate is the estimate backend's configuration (llm-d's names). Every
// field is optional; zero means the built-in value.
type Estimate struct {
	Image *ImageEstimate `json:"image"`
	Video *VideoEstimate `json:"video"`
}

// Resolution is an image or frame size in pixels.
type Resolution struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// ImageEstimate sets how many placeholder tokens an image counts:
// mode dynamic (default) is width*height/dynamic.factor with the size
// decoded from a base64 data URL, else defaultResolution; mode static is
// static.staticToken per image.
type ImageEstimate struct {
	Mode              string      `json:"mode"`
	DefaultResolution *Resolution `json:"defaultResolution"`
	Dynamic           *struct {
		Factor int `json:"factor"`
	} `json:"dynamic"`
	Static *struct {
		StaticToken int `json:"staticToken"`
	} `json:"static"`
}

// VideoEstimate sets a video's placeholder tokens: frames x tokens per
// frame, capped at maxVideoTokens.
type VideoEstimate struct {
	DefaultResolution *Resolution `json:"defaultResolution"`
	DefaultDuration   float64     `json:"defaultDuration"`
	MaxVideoTokens    int         `json:"maxVideoTokens"`
	TokensPerFrame    *struct {
		Mode    string `json:"mode"`
		Dynamic *struct {
			Factor int `json:"factor"`
		} `json:"dynamic"`
		Static *struct {
			NumTokensPerFrame int `json:"numTokensPerFrame"`
		} `json:"static"`
	} `json:"tokensPerFrame"`
	Frames *struct {
		Mode      string `json:"mode"`
		MinFrames int    `json:"minFrames"`
		MaxFrames int    `json:"maxFrames"`
		Sampled   *struct {
			SampleFPS         float64 `json:"sampleFPS"`
			TemporalPatchSize int     `json:"temporalPatchSize"`
		} `json:"sampled"`
		Strided *struct {
			DefaultSourceFPS float64 `json:"defaultSourceFPS"`
			FrameStride      int     `json:"frameStride"`
		} `json:"strided"`
	} `json:"frames"`
}

// estimator is the resolved estimate configuration.
type estimator struct {
	imageStatic                       bool
	imageTokens, imageW, imageH       int
	imageFactor                       int
	frameStatic, strided              bool
	frameTokens, frameFactor          int
	frameW, frameH                    int
	seconds, sampleFPS, sourceFPS     float64
	stride, patch, minFrames, maxFrms int
	maxVideoTokens                    int
}

// newEstimator validates e and fills in the built-in values.
func newEstimator(e *Estimate) (*estimator, error) {
	est := &estimator{imageW: defaultWidth, imageH: defaultHeight, imageFactor: defaultFactor,
		frameW: defaultWidth, frameH: defaultHeight, frameFactor: defaultFactor,
		seconds: defaultVideoSeconds, sampleFPS: defaultSampleFPS, sourceFPS: defaultSourceFPS, stride: 1}
	var errs []error
	pos := func(field string, v int, dst *int) {
		switch {
		case v < 0:
			errs = append(errs, fmt.Errorf("parameters.estimate.%s must not be negative, got %d", field, v))
		case v > 0:
			*dst = v
		}
	}
	posf := func(field string, v float64, dst *float64) {
		switch {
		case v < 0:
			errs = append(errs, fmt.Errorf("parameters.estimate.%s must not be negative, got %g", field, v))
		case v > 0:
			*dst = v
		}
	}
	mode := func(field, v, a, b string) bool {
		if v != "" && v != a && v != b {
			errs = append(errs, fmt.Errorf("parameters.estimate.%s: %q, want %q or %q", field, v, a, b))
		}
		return v == b
	}
	if img := e.Image; img != nil {
		est.imageStatic = mode("image.mode", img.Mode, "dynamic", "static")
		if r := img.DefaultResolution; r != nil {
			pos("image.defaultResolution.width", r.Width, &est.imageW)
			pos("image.defaultResolution.height", r.Height, &est.imageH)
		}
		if img.Dynamic != nil {
			pos("image.dynamic.factor", img.Dynamic.Factor, &est.imageFactor)
		}
		if img.Static != nil {
			pos("image.static.staticToken", img.Static.StaticToken, &est.imageTokens)
		}
	}
	if v := e.Video; v != nil {
		if r := v.DefaultResolution; r != nil {
			pos("video.defaultResolution.width", r.Width, &est.frameW)
			pos("video.defaultResolution.height", r.Height, &est.frameH)
		}
		posf("video.defaultDuration", v.DefaultDuration, &est.seconds)
		pos("video.maxVideoTokens", v.MaxVideoTokens, &est.maxVideoTokens)
		if t := v.TokensPerFrame; t != nil {
			est.frameStatic = mode("video.tokensPerFrame.mode", t.Mode, "dynamic", "static")
			if t.Dynamic != nil {
				pos("video.tokensPerFrame.dynamic.factor", t.Dynamic.Factor, &est.frameFactor)
			}
			if t.Static != nil {
				pos("video.tokensPerFrame.static.numTokensPerFrame", t.Static.NumTokensPerFrame, &est.frameTokens)
			}
		}
		if f := v.Frames; f != nil {
			est.strided = mode("video.frames.mode", f.Mode, "sampled", "strided")
			pos("video.frames.minFrames", f.MinFrames, &est.minFrames)
			pos("video.frames.maxFrames", f.MaxFrames, &est.maxFrms)
			if s := f.Sampled; s != nil {
				posf("video.frames.sampled.sampleFPS", s.SampleFPS, &est.sampleFPS)
				pos("video.frames.sampled.temporalPatchSize", s.TemporalPatchSize, &est.patch)
			}
			if s := f.Strided; s != nil {
				posf("video.frames.strided.defaultSourceFPS", s.DefaultSourceFPS, &est.sourceFPS)
				pos("video.frames.strided.frameStride", s.FrameStride, &est.stride)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return est, nil
}

// imageCount is an image's placeholder count, at least 1 so that every
// image weighs in the prompt. Only a base64 data payload's size is read:
// the picker fetches nothing.
func (e *estimator) imageCount(payload string) int {
	if e.imageStatic {
		return max(e.imageTokens, 1)
	}
	w, h := e.imageW, e.imageH
	if dw, dh, ok := base64ImageSize(payload); ok {
		w, h = dw, dh
	}
	return max(w*h/e.imageFactor, 1)
}

// dataURLPayload is the base64 payload of a data:image/...;base64, URL,
// "" for anything else.
func dataURLPayload(url string) string {
	if !strings.HasPrefix(url, "data:image/") {
		return ""
	}
	_, payload, ok := strings.Cut(url, "base64,")
	if !ok {
		return ""
	}
	return payload
}

// base64ImageSize decodes only as much of a base64 image as its header
// needs.
func base64ImageSize(payload string) (w, h int, ok bool) {
	if payload == "" {
		return 0, 0, false
	}
	cfg, _, err := image.DecodeConfig(base64.NewDecoder(base64.StdEncoding, strings.NewReader(payload)))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}

// video are a request's video properties from its headers (zero: not
// sent).
type video struct {
	w, h        int
	seconds, fp float64
}

func videoHeaders(headers map[string]string) video {
	var v video
	num := func(name string) float64 {
		f, err := strconv.ParseFloat(strings.TrimSpace(headers[name]), 64)
		if err != nil || f <= 0 {
			return 0
		}
		return f
	}
	v.fp, v.seconds = num(eppwire.HeaderVideoFPS), num(eppwire.HeaderVideoDuration)
	if ws, hs, ok := strings.Cut(strings.ToLower(headers[eppwire.HeaderVideoResolution]), "x"); ok {
		w, errW := strconv.Atoi(strings.TrimSpace(ws))
		h, errH := strconv.Atoi(strings.TrimSpace(hs))
		if errW == nil && errH == nil && w > 0 && h > 0 {
			v.w, v.h = w, h
		}
	}
	return v
}

// videoCount is a video's placeholder count: frames x tokens per frame,
// capped at maxVideoTokens, at least 1. The headers' duration, source
// frame rate and resolution win over the configuration.
func (e *estimator) videoCount(v video) int {
	seconds := e.seconds
	if v.seconds > 0 {
		seconds = v.seconds
	}
	clamp := func(n int) int {
		if e.minFrames > 0 && n < e.minFrames {
			n = e.minFrames
		}
		if e.maxFrms > 0 && n > e.maxFrms {
			n = e.maxFrms
		}
		return n
	}
	var frames int
	if e.strided {
		fps := e.sourceFPS
		if v.fp > 0 {
			fps = v.fp
		}
		frames = clamp(int(seconds*fps) / e.stride)
	} else {
		frames = clamp(int(seconds * e.sampleFPS))
		if e.patch > 1 {
			frames /= e.patch
		}
	}
	perFrame := max(e.frameTokens, 1)
	if !e.frameStatic {
		w, h := e.frameW, e.frameH
		if v.w > 0 {
			w, h = v.w, v.h
		}
		perFrame = max(w*h/e.frameFactor, 1)
	}
	n := frames * perFrame
	if e.maxVideoTokens > 0 && n > e.maxVideoTokens {
		n = e.maxVideoTokens
	}
	return max(n, 1)
}

// pseudo builds a prompt's pseudo-token stream: its text bytes, four to a
// token, with every image, video or audio part as that many tokens of its
// content hash on a token boundary, so that an asset weighs what the
// model server's placeholders weigh and two assets never share a token.
type pseudo struct {
	b []byte
}

func (p *pseudo) text(s string) { p.b = append(p.b, s...) }

func (p *pseudo) align() {
	if r := len(p.b) % bytesPerToken; r != 0 {
		p.b = append(p.b, make([]byte, bytesPerToken-r)...)
	}
}

func (p *pseudo) asset(content string, count int) {
	p.align()
	var tok [bytesPerToken]byte
	binary.LittleEndian.PutUint32(tok[:], uint32(xxhash.Sum64String(content)))
	for range count {
		p.b = append(p.b, tok[:]...)
	}
}

// tokens packs the stream into little-endian uint32 tokens, zero-padding
// the tail.
func (p *pseudo) tokens() []int {
	p.align()
	out := make([]int, len(p.b)/bytesPerToken)
	for i := range out {
		out[i] = int(binary.LittleEndian.Uint32(p.b[i*bytesPerToken:]))
	}
	return out
}

// compact is raw JSON without insignificant whitespace; raw as is when it
// does not compact.
func compact(raw json.RawMessage) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return raw
	}
	return buf.Bytes()
}

// part is one content part of a message.
type part = openai.ContentPart

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// content decodes a message content: a string, or parts.
func content(raw json.RawMessage) (string, []part, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var parts []part
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, fmt.Errorf("message content: %w", err)
	}
	return "", parts, nil
}

// Estimate returns the pseudo tokens of body, sent with headers: token
// ids as given, else the pseudo-token stream of its prompt.
func (e *estimator) Estimate(body *openai.Request, headers map[string]string) ([]int, error) {
	if len(body.PromptTokenIDs) > 0 {
		return body.PromptTokenIDs, nil
	}
	var p pseudo
	var err error
	switch body.API {
	case openai.ChatCompletions:
		err = e.chat(&p, body, videoHeaders(headers))
	case openai.Messages:
		err = e.anthropic(&p, body)
	case openai.Completions, openai.VLLMGRPC:
		p.text(body.Prompt)
	case openai.Responses:
		// The instructions, tools and input as a JSON array of one-key
		// objects, as llm-d marshals them.
		p.text("[")
		for _, f := range []string{"instructions", "tools", "input"} {
			if raw := body.RawField(f); raw != nil && (f == "input" || string(raw) != "null") {
				if len(p.b) > 1 {
					p.text(",")
				}
				p.text(`{"` + f + `":`)
				p.b = append(p.b, compact(raw)...)
				p.text("}")
			}
		}
		p.text("]")
	case openai.Embeddings:
		p.b = append(p.b, compact(body.RawField("input"))...)
	default:
		return nil, fmt.Errorf("no token estimate for %s requests", body.API)
	}
	if err != nil {
		return nil, err
	}
	if len(p.b) == 0 {
		return nil, nil
	}
	return p.tokens(), nil
}

// messages adds the tools' JSON, then each message's role and content,
// with onPart adding each content part that is not text.
func (e *estimator) messages(p *pseudo, body *openai.Request, prelude func() error, onPart func(c part) error) error {
	if tools := body.RawField("tools"); len(tools) > 0 && string(tools) != "null" && string(tools) != "[]" {
		p.b = append(p.b, compact(tools)...)
	}
	if err := prelude(); err != nil {
		return err
	}
	var msgs []message
	if err := json.Unmarshal(body.RawField("messages"), &msgs); err != nil {
		return fmt.Errorf("messages: %w", err)
	}
	for _, m := range msgs {
		p.text(m.Role)
		s, parts, err := content(m.Content)
		if err != nil {
			return err
		}
		p.text(s)
		for _, c := range parts {
			if c.Type == "text" {
				p.text(c.Text)
			} else if err := onPart(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// chat is an OpenAI chat request's stream.
func (e *estimator) chat(p *pseudo, body *openai.Request, v video) error {
	return e.messages(p, body, func() error { return nil }, func(c part) error {
		switch c.Type {
		case "image_url":
			if c.ImageURL != nil {
				p.asset(c.ImageURL.URL, e.imageCount(dataURLPayload(c.ImageURL.URL)))
			}
		case "video_url":
			if c.VideoURL != nil {
				p.asset(c.VideoURL.URL, e.videoCount(v))
			}
		case "input_audio":
			if c.InputAudio != nil {
				data := c.InputAudio.Data + c.InputAudio.Format
				p.asset(data, assetCount(len(data)))
			}
		case "audio_url":
			if c.AudioURL != nil {
				p.asset(c.AudioURL.URL, assetCount(len(c.AudioURL.URL)))
			}
		}
		return nil
	})
}

// assetCount is the placeholder count of an asset no estimator sizes (audio):
// its bytes at four a token, at least 1.
func assetCount(n int) int { return max((n+bytesPerToken-1)/bytesPerToken, 1) }

// anthropic is an Anthropic Messages request's stream: the system text
// (without the billing header) comes after the tools.
func (e *estimator) anthropic(p *pseudo, body *openai.Request) error {
	system := func() error {
		s, parts, err := content(body.RawField("system"))
		if err != nil {
			return fmt.Errorf("system: %w", err)
		}
		p.text(s)
		for _, c := range parts {
			if c.Type == "text" && !strings.HasPrefix(c.Text, anthropicBillingPrefix) {
				p.text(c.Text)
			}
		}
		return nil
	}
	return e.messages(p, body, system, func(c part) error {
		switch c.Type {
		case "image":
			e.anthropicImage(p, c)
		case "thinking":
			p.text(c.Thinking)
		case "tool_use":
			p.text(c.ID)
			p.text(c.Name)
			p.b = append(p.b, c.Input...)
		case "tool_result":
			s, inner, err := content(c.Content)
			if err != nil {
				return err
			}
			p.text(s)
			var texts []string
			for _, in := range inner {
				if in.Type == "text" {
					texts = append(texts, in.Text)
				}
			}
			p.text(strings.Join(texts, "\n"))
			for _, in := range inner {
				if in.Type == "image" {
					e.anthropicImage(p, in)
				}
			}
		}
		return nil
	})
}

// anthropicImage adds an Anthropic image block: a URL source, or base64
// data whose size is decoded.
func (e *estimator) anthropicImage(p *pseudo, c part) {
	switch {
	case c.Source == nil:
	case c.Source.URL != "":
		p.asset(c.Source.URL, e.imageCount(dataURLPayload(c.Source.URL)))
	case c.Source.Data != "":
		p.asset(c.Source.Data, e.imageCount(c.Source.Data))
	}
}
