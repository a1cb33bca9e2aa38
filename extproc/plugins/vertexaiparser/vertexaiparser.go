// Package vertexaiparser is llm-d's vertexai-parser: the request parser
// for Vertex AI's gRPC PredictionService, whose ChatCompletions,
// RawPredict and StreamRawPredict requests carry an OpenAI body inside a
// google.api.HttpBody (field 2 of the request, its data in field 2). The
// parser unwraps the gRPC frame (uncompressed, one message) and the
// protobuf, and parses the JSON as a chat completion (ChatCompletions) or
// a responses request (the raw predictions), as llm-d does. A model
// rewrite rebuilds the envelope around the rewritten JSON, every other
// field kept byte for byte.
//
// Parameters: none.
package vertexaiparser

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "vertexai-parser"

// methods are the claimed gRPC method suffixes and the API of their JSON.
var methods = []struct {
	suffix string
	api    openai.API
}{
	{"PredictionService/ChatCompletions", openai.ChatCompletions},
	{"PredictionService/StreamRawPredict", openai.Responses},
	{"PredictionService/RawPredict", openai.Responses},
}

// httpBodyField is the HttpBody field of the three requests, and the data
// field of HttpBody.
const httpBodyField, dataField protowire.Number = 2, 2

// Parser implements vertexai-parser.
type Parser struct{ parsers.Plugin }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := parsers.NewPlugin(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Parser{n}, nil
}

// Claims implements parsers.Parser.
func (p *Parser) Claims() []string {
	out := make([]string, len(methods))
	for i, m := range methods {
		out[i] = m.suffix
	}
	return out
}

// ParseBody implements parsers.Parser.
func (p *Parser) ParseBody(path string, body []byte) (*openai.Request, error) {
	api := openai.API("")
	for _, m := range methods {
		if strings.HasSuffix(path, m.suffix) {
			api = m.api
			break
		}
	}
	if api == "" {
		return nil, nil // not a claimed path: the Set does not send it here
	}
	msg, err := parsers.GRPCMessage(body)
	if err != nil {
		return nil, err
	}
	env, err := split(msg, httpBodyField)
	if err != nil {
		return nil, fmt.Errorf("%w: request message: %v", openai.ErrInvalidRequest, err)
	}
	if env.value == nil {
		return nil, fmt.Errorf("%w: the request has no http_body", openai.ErrInvalidRequest)
	}
	hb, err := split(env.value, dataField)
	if err != nil {
		return nil, fmt.Errorf("%w: http_body: %v", openai.ErrInvalidRequest, err)
	}
	r, err := openai.Parse(api, hb.value)
	if err != nil {
		return nil, err
	}
	r.Wrap(func(inner []byte) ([]byte, error) {
		return parsers.GRPCFrame(env.join(hb.join(inner))), nil
	})
	return r, nil
}

// message is a protobuf message split around one length-delimited field:
// the other fields' bytes, and the field's value (its last occurrence, as
// protobuf decoders read a singular field; nil when absent).
type message struct {
	num   protowire.Number
	rest  []byte
	value []byte
}

func split(b []byte, num protowire.Number) (message, error) {
	m := message{num: num}
	for len(b) > 0 {
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return m, protowire.ParseError(tagLen)
		}
		valLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
		if valLen < 0 {
			return m, protowire.ParseError(valLen)
		}
		field := b[:tagLen+valLen]
		if n == num {
			if typ != protowire.BytesType {
				return m, errors.New("field " + fmt.Sprint(num) + " is not length-delimited")
			}
			v, _ := protowire.ConsumeBytes(b[tagLen:])
			m.value = v
			if m.value == nil {
				m.value = []byte{}
			}
		} else {
			m.rest = append(m.rest, field...)
		}
		b = b[tagLen+valLen:]
	}
	return m, nil
}

// join is the message with its field set to value.
func (m message) join(value []byte) []byte {
	out := append([]byte(nil), m.rest...)
	out = protowire.AppendTag(out, m.num, protowire.BytesType)
	return protowire.AppendBytes(out, value)
}

var _ parsers.Parser = (*Parser)(nil)
