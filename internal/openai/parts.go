package openai

import "encoding/json"

// ContentPart is one part of an array message content, OpenAI's chat
// parts and Anthropic's blocks alike (the fields of both): the plugins that
// read media (token estimation, encoder-cache affinity) decode it.
type ContentPart struct {
	Type     string  `json:"type"`
	Text     string  `json:"text"`
	Thinking string  `json:"thinking"`
	ImageURL *URLRef `json:"image_url"`
	VideoURL *URLRef `json:"video_url"`
	AudioURL *URLRef `json:"audio_url"`
	// InputAudio is OpenAI's inline audio.
	InputAudio *struct {
		Data   string `json:"data"`
		Format string `json:"format"`
	} `json:"input_audio"`
	// Source is an Anthropic image's: base64 data or a URL.
	Source *struct {
		Data string `json:"data"`
		URL  string `json:"url"`
	} `json:"source"`
	// ID, Name and Input are an Anthropic tool_use's; Content a
	// tool_result's.
	ID      string          `json:"id"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"`
}

// URLRef is a part's {"url": ...}.
type URLRef struct {
	URL string `json:"url"`
}
