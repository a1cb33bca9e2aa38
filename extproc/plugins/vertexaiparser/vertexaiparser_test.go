package vertexaiparser

import (
	"encoding/binary"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/api/httpbody"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/internal/openai"
)

const chat = `{"model":"google/gemma","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`

// request is a Vertex AI request as a client sends it: endpoint (field 1),
// http_body (field 2, a real google.api.HttpBody) and a field the parser
// does not know, gRPC-framed.
func request(t *testing.T, data string) []byte {
	t.Helper()
	hb, err := proto.Marshal(&httpbody.HttpBody{ContentType: "application/json", Data: []byte(data)})
	if err != nil {
		t.Fatal(err)
	}
	var msg []byte
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "projects/p/locations/l/endpoints/e")
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, hb)
	msg = protowire.AppendTag(msg, 9, protowire.VarintType)
	msg = protowire.AppendVarint(msg, 42)
	return parsers.GRPCFrame(msg)
}

func parser(t *testing.T) *Parser {
	t.Helper()
	p, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Parser)
}

func TestParseAndRewrite(t *testing.T) {
	p := parser(t)
	for path, api := range map[string]openai.API{
		"/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions": openai.ChatCompletions,
		"/google.cloud.aiplatform.v1.PredictionService/RawPredict":           openai.Responses,
		"/google.cloud.aiplatform.v1.PredictionService/StreamRawPredict":     openai.Responses,
	} {
		body := chat
		if api == openai.Responses {
			body = `{"model":"google/gemma","input":"hi"}`
		}
		r, err := p.ParseBody(path, request(t, body))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if r.API != api || r.Model != "google/gemma" || r.PromptText() == "" {
			t.Fatalf("%s: parsed %+v", path, r)
		}
	}
	r, err := p.ParseBody("/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions", request(t, chat))
	if err != nil {
		t.Fatal(err)
	}
	if r.MaxTokens != 5 || len(r.Messages) != 1 {
		t.Fatalf("parsed %+v", r)
	}
	out, err := r.WithModel("other")
	if err != nil {
		t.Fatal(err)
	}
	// The rewritten body is a gRPC frame whose HttpBody holds the
	// rewritten JSON; the other fields are kept.
	if n := binary.BigEndian.Uint32(out[1:5]); out[0] != 0 || int(n) != len(out)-5 {
		t.Fatalf("frame header % x", out[:5])
	}
	env, err := split(out[5:], httpBodyField)
	if err != nil {
		t.Fatal(err)
	}
	var hb httpbody.HttpBody
	if err := proto.Unmarshal(env.value, &hb); err != nil {
		t.Fatal(err)
	}
	if hb.GetContentType() != "application/json" || string(hb.GetData()) != `{"model":"other","messages":[{"role":"user","content":"hi"}],"max_tokens":5}` {
		t.Fatalf("http_body %v", &hb)
	}
	orig, _ := split(request(t, chat)[5:], httpBodyField)
	if string(env.rest) != string(orig.rest) {
		t.Fatalf("other fields changed: % x, want % x", env.rest, orig.rest)
	}
}

func TestRefusals(t *testing.T) {
	p := parser(t)
	const path = "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"
	compressed := request(t, chat)
	compressed[0] = 1
	noBody := parsers.GRPCFrame(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "e"))
	notBytes := parsers.GRPCFrame(protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1))
	for name, body := range map[string][]byte{
		"empty":       nil,
		"short frame": request(t, chat)[:20],
		"compressed":  compressed,
		"no body":     noBody,
		"not bytes":   notBytes,
		"garbage":     parsers.GRPCFrame([]byte{0xff, 0xff, 0xff}),
		"bad json":    request(t, `{"model":`),
		"no model":    request(t, `{"messages":[{"role":"user","content":"x"}]}`),
	} {
		if _, err := p.ParseBody(path, body); !errors.Is(err, openai.ErrInvalidRequest) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// The set routes Vertex's gRPC paths here and others elsewhere.
func TestClaims(t *testing.T) {
	s, err := parsers.NewSet([]parsers.Parser{parser(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Parse("/google.cloud.aiplatform.v1.PredictionService/Predict", request(t, chat)); !errors.Is(err, parsers.ErrUnclaimed) {
		t.Fatalf("unclaimed method: %v", err)
	}
	if r, err := s.Parse("/google.cloud.aiplatform.v1.PredictionService/ChatCompletions", request(t, chat)); err != nil || r == nil {
		t.Fatalf("claimed: %v %v", r, err)
	}
}

func FuzzParseBody(f *testing.F) {
	f.Add([]byte(nil))
	f.Add(parsers.GRPCFrame([]byte{0x12, 0x02, 0x12, 0x00}))
	p, _ := New("", nil, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := p.(*Parser).ParseBody("/x.PredictionService/ChatCompletions", body)
		if err != nil {
			if !errors.Is(err, openai.ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		out, err := r.WithModel("m")
		if err != nil {
			t.Fatal(err)
		}
		r2, err := p.(*Parser).ParseBody("/x.PredictionService/ChatCompletions", out)
		if err != nil || r2.Model != "m" {
			t.Fatalf("rewritten body: %v %v", r2, err)
		}
	})
}
