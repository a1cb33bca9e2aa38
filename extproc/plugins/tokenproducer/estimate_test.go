package tokenproducer

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"image"
	"image/png"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/extproc/plugins/approxprefix"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
)

// pngURL is a data URL of a w x h PNG.
func pngURL(t testing.TB, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
}

func estimateProducer(t testing.TB, params string) *Producer {
	t.Helper()
	p, err := New("tp", []byte(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	pr := p.(*Producer)
	if pr.estimate == nil {
		t.Fatalf("%s: not the estimate backend", params)
	}
	return pr
}

// placeholder is the pseudo token of an asset's content.
func placeholder(content string) int { return int(uint32(xxhash.Sum64String(content))) }

// word packs four bytes as a pseudo token.
func word(s string) int {
	var b [4]byte
	copy(b[:], s)
	return int(binary.LittleEndian.Uint32(b[:]))
}

// runs counts the tokens equal to tok.
func runs(tokens []int, tok int) int {
	n := 0
	for _, x := range tokens {
		if x == tok {
			n++
		}
	}
	return n
}

func TestEstimateTokens(t *testing.T) {
	big := pngURL(t, 1280, 720) // 900 placeholders at factor 1024
	chat := func(parts string) string {
		return `{"model":"m","messages":[{"role":"user","content":[` + parts + `]}]}`
	}
	for _, tc := range []struct {
		name, params, api, body string
		headers                 map[string]string
		// want are the expected tokens when given; else count and the
		// placeholder runs.
		want   []int
		count  int
		assets map[string]int
	}{
		{name: "text packs four bytes a token", params: `{}`, api: "chat",
			body: `{"model":"m","messages":[{"role":"user","content":"abcdefg"}]}`,
			want: []int{word("user"), word("abcd"), word("efg")}},
		{name: "role then parts, padded to a token", params: `{}`, api: "chat",
			body: chat(`{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}`),
			// "user" "hi\0\0" then 640*360/1024 = 225 placeholders
			count: 2 + 225, assets: map[string]int{"http://x/a.png": 225}},
		{name: "guide's dynamic 1280x720 default for a remote image", api: "chat",
			params: `{"estimate":{"image":{"mode":"dynamic","defaultResolution":{"width":1280,"height":720},"dynamic":{"factor":1024}}}}`,
			body:   chat(`{"type":"image_url","image_url":{"url":"http://x/a.png"}}`),
			count:  1 + 900, assets: map[string]int{"http://x/a.png": 900}},
		{name: "data URL dimensions decoded", params: `{}`, api: "chat",
			body:  chat(`{"type":"image_url","image_url":{"url":"` + big + `"}}`),
			count: 1 + 900, assets: map[string]int{big: 900}},
		{name: "undecodable data URL falls back to the default", params: `{}`, api: "chat",
			body:  chat(`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}`),
			count: 1 + 225, assets: map[string]int{"data:image/png;base64,AAAA": 225}},
		{name: "static mode", params: `{"estimate":{"image":{"mode":"static","static":{"staticToken":7}}}}`, api: "chat",
			body:  chat(`{"type":"image_url","image_url":{"url":"` + big + `"}}`),
			count: 1 + 7, assets: map[string]int{big: 7}},
		{name: "tiny image weighs one token", params: `{}`, api: "chat",
			body:  chat(`{"type":"image_url","image_url":{"url":"` + pngURL(t, 2, 2) + `"}}`),
			count: 2},
		{name: "video: default 10 s at 2 fps of 640x360 frames", params: `{}`, api: "chat",
			body:  chat(`{"type":"video_url","video_url":{"url":"http://x/v.mp4"}}`),
			count: 1 + 20*225, assets: map[string]int{"http://x/v.mp4": 20 * 225}},
		{name: "video headers win, capped", api: "chat",
			params:  `{"estimate":{"video":{"maxVideoTokens":1000,"frames":{"mode":"strided","strided":{"frameStride":4}}}}}`,
			headers: map[string]string{eppwire.HeaderVideoDuration: "2", eppwire.HeaderVideoFPS: "30", eppwire.HeaderVideoResolution: "64x32"},
			body:    chat(`{"type":"video_url","video_url":{"url":"http://x/v.mp4"}}`),
			// 2*30/4 = 15 frames of 64*32/1024 = 2 tokens
			count: 1 + 30, assets: map[string]int{"http://x/v.mp4": 30}},
		{name: "sampled with temporal patches, static frames", api: "chat",
			params: `{"estimate":{"video":{"defaultDuration":4,"tokensPerFrame":{"mode":"static","static":{"numTokensPerFrame":3}},"frames":{"sampled":{"sampleFPS":2,"temporalPatchSize":2},"minFrames":10}}}}`,
			body:   chat(`{"type":"video_url","video_url":{"url":"http://x/v.mp4"}}`),
			// max(4*2, 10) = 10 frames / 2 = 5 groups of 3
			count: 1 + 15, assets: map[string]int{"http://x/v.mp4": 15}},
		{name: "audio data", params: `{}`, api: "chat",
			body:  chat(`{"type":"input_audio","input_audio":{"data":"QUJDREVGR0g=","format":"wav"}}`),
			count: 1 + 4, assets: map[string]int{"QUJDREVGR0g=wav": 4}},
		{name: "tools first, compacted", params: `{}`, api: "chat",
			body: `{"model":"m","tools":[ {"a": 1} ],"messages":[{"role":"user","content":"x"}]}`,
			want: []int{word(`[{"a`), word(`":1}`), word(`]use`), word(`rx`)}},
		{name: "completions prompt", params: `{}`, api: "completions",
			body: `{"model":"m","prompt":"abcdefgh"}`, want: []int{word("abcd"), word("efgh")}},
		{name: "token ids pass through", params: `{}`, api: "completions",
			body: `{"model":"m","prompt":[5,6,7]}`, want: []int{5, 6, 7}},
		{name: "embeddings input JSON", params: `{}`, api: "embeddings",
			body: `{"model":"m","input":"abcd"}`, want: []int{word(`"abc`), word(`d"`)}},
		{name: "anthropic system, blocks, image data", params: `{}`, api: "messages",
			body: `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"x-anthropic-billing-header: 1"},{"type":"text","text":"sys!"}],` +
				`"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` +
				strings.TrimPrefix(big, "data:image/png;base64,") + `"}}]}]}`,
			count: 2 + 900, assets: map[string]int{strings.TrimPrefix(big, "data:image/png;base64,"): 900}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := estimateProducer(t, tc.params)
			body, err := openai.Parse(openai.API(map[string]string{"chat": string(openai.ChatCompletions), "completions": string(openai.Completions),
				"embeddings": string(openai.Embeddings), "messages": string(openai.Messages)}[tc.api]), []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req := &scheduling.Request{Body: body, Headers: tc.headers, PromptTokens: 1}
			cs := scheduling.NewCycleState()
			p.Produce(t.Context(), cs, req, nil)
			got, ok := scheduling.Read(cs, prefixmatch.TokensKey)
			if !ok {
				t.Fatal("no tokens")
			}
			if tc.want != nil && !slices.Equal(*got, tc.want) {
				t.Fatalf("tokens %v, want %v", *got, tc.want)
			}
			if tc.want == nil && len(*got) != tc.count {
				t.Fatalf("%d tokens, want %d", len(*got), tc.count)
			}
			if req.PromptTokens != len(*got) {
				t.Fatalf("prompt length %d, want %d", req.PromptTokens, len(*got))
			}
			for content, n := range tc.assets {
				if r := runs(*got, placeholder(content)); r != n {
					t.Fatalf("%d placeholders of %.30q, want %d", r, content, n)
				}
			}
		})
	}
}

// TestEstimatePrefixLocality: the token producer runs before the
// approximate producer, which hashes the pseudo tokens (an image weighs its
// placeholders), not the prompt's JSON bytes.
func TestEstimatePrefixLocality(t *testing.T) {
	tp := estimateProducer(t, `{}`)
	ap, err := approxprefix.New("ap", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	producers, err := scheduling.OrderProducers([]scheduling.DataProducer{ap.(scheduling.DataProducer), tp})
	if err != nil {
		t.Fatal(err)
	}
	if producers[0] != tp {
		t.Fatalf("token-producer must run before the approximate producer: %v", producers)
	}
	src := ap.(prefixmatch.Source)
	blocks := func(url string) int {
		body, err := openai.Parse(openai.ChatCompletions, []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`+url+`"}},{"type":"text","text":"`+strings.Repeat("describe it ", 100)+`"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		cs := scheduling.NewCycleState()
		for _, p := range producers {
			p.Produce(t.Context(), cs, &scheduling.Request{Body: body}, nil)
		}
		m, ok := src.MatchOf(cs)
		if !ok {
			t.Fatal("no match")
		}
		return m.Blocks
	}
	// 225 image tokens + 4 + 300 text tokens: blocks of 64 tokens.
	if got, want := blocks("http://x/a.png"), (225+1+300)/64; got != want {
		t.Fatalf("%d blocks, want %d (the pseudo tokens, not the text's bytes)", got, want)
	}
}

func FuzzEstimate(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`)
	f.Add(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[1]}`)
	f.Add(`{"model":"m","messages":[{"role":"user","content":[{"type":"video_url","video_url":null}]}]}`)
	e, err := newEstimator(&Estimate{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, api := range []openai.API{openai.ChatCompletions, openai.Messages, openai.Completions, openai.Responses, openai.Embeddings} {
			r, err := openai.Parse(api, []byte(body))
			if err != nil {
				continue
			}
			_, _ = e.Estimate(r, map[string]string{eppwire.HeaderVideoResolution: body})
		}
	})
}
