// Package alwaysdisagg holds llm-d's unconditional deciders:
// always-disagg-pd-decider approves the prefill stage for every request
// (for tests and benchmarks), always-disagg-multimodal-decider the encode
// stage for every chat request with a multimodal part (image_url,
// audio_url, video_url or input_audio content). A request routed on the
// wasm filter's headers alone has no body to look at and is not sent to
// an encoder.
//
// Parameters: none.
package alwaysdisagg

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	PDType         = "always-disagg-pd-decider"
	MultimodalType = "always-disagg-multimodal-decider"
)

// PD implements always-disagg-pd-decider.
type PD struct{ scheduling.Named }

// NewPD is always-disagg-pd-decider's factory.
func NewPD(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(PDType, name, raw)
	if err != nil {
		return nil, err
	}
	return &PD{n}, nil
}

// Disaggregate implements disagg.Decider.
func (*PD) Disaggregate(context.Context, *scheduling.CycleState, *scheduling.Request, *endpoints.Endpoint) bool {
	return true
}

// Multimodal implements always-disagg-multimodal-decider.
type Multimodal struct{ scheduling.Named }

// NewMultimodal is always-disagg-multimodal-decider's factory.
func NewMultimodal(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(MultimodalType, name, raw)
	if err != nil {
		return nil, err
	}
	return &Multimodal{n}, nil
}

// Disaggregate implements disagg.Decider.
func (*Multimodal) Disaggregate(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, _ *endpoints.Endpoint) bool {
	if req.Body == nil {
		return false
	}
	for _, m := range req.Body.Messages {
		if hasMedia(m.Content) {
			return true
		}
	}
	return false
}

// mediaParts are the content part types an encoder serves.
var mediaParts = map[string]bool{"image_url": true, "audio_url": true, "video_url": true, "input_audio": true}

// hasMedia reports whether a message's content is an array holding a
// multimodal part. A string content, or one that is not an array of
// objects, holds none.
func hasMedia(content json.RawMessage) bool {
	if len(content) == 0 || content[0] != '[' {
		return false
	}
	var parts []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(content, &parts) != nil {
		return false
	}
	for _, p := range parts {
		if mediaParts[p.Type] {
			return true
		}
	}
	return false
}
