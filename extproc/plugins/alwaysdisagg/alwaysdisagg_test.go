package alwaysdisagg

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
)

func TestMultimodal(t *testing.T) {
	m, err := schedtest.Build[*Multimodal](NewMultimodal, "")
	if err != nil {
		t.Fatal(err)
	}
	for content, want := range map[string]bool{
		`"just text"`:                  false,
		`[{"type":"text","text":"a"}]`: false,
		`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]`: true,
		`[{"type":"audio_url","audio_url":{"url":"u"}}]`:                            true,
		`[{"type":"video_url","video_url":{"url":"u"}}]`:                            true,
		`[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]`:        true,
		`[1,2]`: false,
	} {
		req := &scheduling.Request{Body: &openai.Request{Messages: []openai.Message{{Role: "system", Content: json.RawMessage(`"s"`)}, {Role: "user", Content: json.RawMessage(content)}}}}
		if got := m.Disaggregate(context.Background(), nil, req, nil); got != want {
			t.Errorf("%s: %v, want %v", content, got, want)
		}
	}
	if m.Disaggregate(context.Background(), nil, &scheduling.Request{}, nil) {
		t.Error("a body-less request went to an encoder")
	}
	pd, err := schedtest.Build[*PD](NewPD, "")
	if err != nil || !pd.Disaggregate(context.Background(), nil, &scheduling.Request{}, nil) {
		t.Errorf("always-disagg-pd-decider: %v", err)
	}
	if _, err := schedtest.Build[*PD](NewPD, `{"x":1}`); err == nil {
		t.Error("parameters accepted")
	}
}

// Any content, valid JSON or not, is answered without a panic, and only
// an array can hold a multimodal part.
func FuzzHasMedia(f *testing.F) {
	f.Add([]byte(`[{"type":"image_url"}]`))
	f.Add([]byte(`"text"`))
	f.Fuzz(func(t *testing.T, content []byte) {
		if hasMedia(content) && content[0] != '[' {
			t.Fatalf("%q", content)
		}
	})
}
