package vllmgrpcparser

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/internal/openai"
)

// Builders of vllm_engine.proto messages in the wire format.
func bytesField(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func varintField(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// tokenized is a TokenizedInput with original_text and input_ids, packed
// or one field per id.
func tokenized(packed bool, ids ...uint64) []byte {
	msg := bytesField(nil, 1, []byte("original"))
	if packed {
		var p []byte
		for _, id := range ids {
			p = protowire.AppendVarint(p, id)
		}
		return bytesField(msg, tokInputIDs, p)
	}
	for _, id := range ids {
		msg = varintField(msg, tokInputIDs, id)
	}
	return msg
}

func sampling(maxTokens uint64) []byte {
	sp := varintField(nil, 3, 40)           // top_k, skipped
	sp = bytesField(sp, 10, []byte("stop")) // stop, skipped
	return varintField(sp, spMaxTokens, maxTokens)
}

func parse(t *testing.T, path string, msg []byte) (*openai.Request, error) {
	t.Helper()
	p, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Parser).ParseBody(path, parsers.GRPCFrame(msg))
}

func TestParse(t *testing.T) {
	gen := "/" + GeneratePath
	for _, tc := range []struct {
		name      string
		path      string
		msg       []byte
		ids       []int
		text      string
		stream    bool
		maxTokens int
	}{
		{name: "tokenized, packed", path: gen,
			msg: bytesField(bytesField(bytesField(nil, 1, []byte("req-1")), reqTokenized, tokenized(true, 1, 300, 70000)), reqSampling, sampling(64)),
			ids: []int{1, 300, 70000}, maxTokens: 64},
		{name: "tokenized, unpacked, streaming", path: gen,
			msg: varintField(bytesField(nil, reqTokenized, tokenized(false, 5, 6)), reqStream, 1),
			ids: []int{5, 6}, stream: true},
		{name: "text", path: gen, msg: bytesField(nil, reqText, []byte("hello there")), text: "hello there"},
		{name: "oneof: the last input wins", path: gen,
			msg: bytesField(bytesField(nil, reqText, []byte("first")), reqTokenized, tokenized(true, 9)), ids: []int{9}},
		{name: "unknown fields skipped (mm_inputs, fixed32)", path: gen,
			msg: protowire.AppendFixed32(protowire.AppendTag(bytesField(bytesField(nil, 7, []byte{0x2a, 0}), reqTokenized, tokenized(true, 4)), 99, protowire.Fixed32Type), 7),
			ids: []int{4}},
		{name: "embed", path: "/" + EmbedPath, msg: bytesField(bytesField(nil, 1, []byte("e")), reqTokenized, tokenized(true, 7, 8)), ids: []int{7, 8}},
		{name: "embed reads no text field", path: "/" + EmbedPath,
			msg: bytesField(bytesField(nil, reqTokenized, tokenized(true, 7)), reqText, []byte("ignored by Embed's schema")), ids: []int{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parse(t, tc.path, tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			if r.API != openai.VLLMGRPC || r.Model != "" {
				t.Fatalf("API %q model %q", r.API, r.Model)
			}
			if !slices.Equal(r.PromptTokenIDs, tc.ids) || r.PromptText() != tc.text || r.Stream != tc.stream || r.MaxTokens != tc.maxTokens {
				t.Fatalf("ids %v text %q stream %v max %d; want %v %q %v %d", r.PromptTokenIDs, r.PromptText(), r.Stream, r.MaxTokens, tc.ids, tc.text, tc.stream, tc.maxTokens)
			}
			// A rewrite cannot name a model in the message: the body
			// goes as sent.
			out, err := r.WithModel("other")
			if err != nil || !bytes.Equal(out, parsers.GRPCFrame(tc.msg)) {
				t.Fatalf("WithModel changed the body: %v", err)
			}
		})
	}
}

func TestRefused(t *testing.T) {
	gen := "/" + GeneratePath
	for name, tc := range map[string]struct {
		body []byte
		want string
	}{
		"no prompt":           {parsers.GRPCFrame(bytesField(nil, 1, []byte("id"))), "no prompt"},
		"empty token list":    {parsers.GRPCFrame(bytesField(nil, reqTokenized, bytesField(nil, 1, []byte("x")))), "no prompt"},
		"not framed":          {[]byte{0, 0}, "no gRPC message"},
		"compressed":          {append([]byte{1, 0, 0, 0, 1}, 0), "compressed"},
		"truncated protobuf":  {parsers.GRPCFrame([]byte{0x12, 0x05, 0x12}), "unexpected EOF"},
		"wrong wire type":     {parsers.GRPCFrame(varintField(nil, reqTokenized, 1)), "wire type"},
		"bad max_tokens type": {parsers.GRPCFrame(bytesField(bytesField(nil, reqText, []byte("x")), reqSampling, bytesField(nil, spMaxTokens, []byte("x")))), "sampling_params"},
	} {
		p, _ := New("", nil, nil)
		_, err := p.(*Parser).ParseBody(gen, tc.body)
		if err == nil || !errors.Is(err, openai.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want an invalid request naming %q", name, err, tc.want)
		}
	}
}

// TestClaims: the configured parser set sends the gRPC methods here, and
// leaves other methods of the service unclaimed.
func TestClaims(t *testing.T) {
	p, _ := New("", nil, nil)
	set, err := parsers.NewSet([]parsers.Parser{p.(parsers.Parser)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := set.Parse("/"+GeneratePath, parsers.GRPCFrame(bytesField(nil, reqTokenized, tokenized(true, 1, 2))))
	if err != nil || len(r.PromptTokenIDs) != 2 {
		t.Fatalf("%v %v", r, err)
	}
	if _, err := set.Parse("/vllm.grpc.engine.VllmEngine/HealthCheck", nil); !errors.Is(err, parsers.ErrUnclaimed) {
		t.Fatalf("HealthCheck: %v", err)
	}
	if _, err := New("", []byte(`{"x":1}`), nil); err == nil {
		t.Fatal("parameters accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(parsers.GRPCFrame(bytesField(nil, reqTokenized, tokenized(true, 1, 2, 3))))
	f.Add(parsers.GRPCFrame(bytesField(bytesField(nil, reqText, []byte("x")), reqSampling, sampling(8))))
	f.Add([]byte{0, 0, 0, 0, 0})
	p, _ := New("", nil, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{GeneratePath, EmbedPath} {
			r, err := p.(*Parser).ParseBody(path, body)
			if err != nil {
				if !errors.Is(err, openai.ErrInvalidRequest) {
					t.Fatalf("error not an invalid request: %v", err)
				}
				continue
			}
			if r.PromptText() == "" && len(r.PromptTokenIDs) == 0 {
				t.Fatal("parsed a request without a prompt")
			}
		}
	})
}
