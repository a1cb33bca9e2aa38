package vllmgrpcparser

import (
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "vllmgrpc-parser"

// The claimed gRPC methods (:path is /<service>/<method>).
const (
	GeneratePath = string(openai.VLLMGRPC) + "/Generate"
	EmbedPath    = string(openai.VLLMGRPC) + "/Embed"
)

// Field numbers of vllm_engine.proto.
const (
	reqTokenized protowire.Number = 2 // GenerateRequest and EmbedRequest
	reqText      protowire.Number = 3
	reqSampling  protowire.Number = 4
	reqStream    protowire.Number = 5
	tokInputIDs  protowire.Number = 2 // TokenizedInput
	spMaxTokens  protowire.Number = 8 // SamplingParams
)

// Parser implements vllmgrpc-parser.
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
func (p *Parser) Claims() []string { return []string{GeneratePath, EmbedPath} }

// request is what routing reads of a Generate or Embed request, in the
// JSON form openai.VLLMGRPC parses.
type request struct {
	Text     string `json:"text,omitempty"`
	TokenIDs []int  `json:"token_ids,omitempty"`
	Stream   bool   `json:"stream,omitempty"`
	Sampling *struct {
		MaxTokens uint64 `json:"max_tokens"`
	} `json:"sampling_params,omitempty"`
}

// ParseBody implements parsers.Parser.
func (p *Parser) ParseBody(path string, body []byte) (*openai.Request, error) {
	generate := strings.HasSuffix(path, GeneratePath)
	if !generate && !strings.HasSuffix(path, EmbedPath) {
		return nil, nil // not a claimed path: the Set does not send it here
	}
	msg, err := parsers.GRPCMessage(body)
	if err != nil {
		return nil, err
	}
	var r request
	if err := decodeRequest(msg, generate, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", openai.ErrInvalidRequest, err)
	}
	if r.Text == "" && len(r.TokenIDs) == 0 {
		return nil, fmt.Errorf("%w: the request has no prompt (tokenized input_ids or text)", openai.ErrInvalidRequest)
	}
	view, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	out, err := openai.Parse(openai.VLLMGRPC, view)
	if err != nil {
		return nil, err
	}
	// No model field to rewrite: the message goes as sent.
	out.Wrap(func([]byte) ([]byte, error) { return body, nil })
	return out, nil
}

// fields calls fn for each field of a protobuf message, with its value's
// bytes (a varint's value in v).
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, val []byte, v uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var val []byte
		var v uint64
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			val, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, val, v); err != nil {
			return err
		}
	}
	return nil
}

func want(num protowire.Number, typ, is protowire.Type) error {
	if typ != is {
		return fmt.Errorf("field %d: wire type %d, want %d", num, typ, is)
	}
	return nil
}

// decodeRequest reads a GenerateRequest (generate) or an EmbedRequest.
// Of the input oneof the last one sent wins, as protobuf decoders read it.
func decodeRequest(msg []byte, generate bool, r *request) error {
	return fields(msg, func(num protowire.Number, typ protowire.Type, val []byte, v uint64) error {
		switch {
		case num == reqTokenized:
			if err := want(num, typ, protowire.BytesType); err != nil {
				return err
			}
			ids, err := inputIDs(val)
			if err != nil {
				return fmt.Errorf("tokenized: %w", err)
			}
			r.Text, r.TokenIDs = "", ids
		case !generate:
		case num == reqText:
			if err := want(num, typ, protowire.BytesType); err != nil {
				return err
			}
			r.Text, r.TokenIDs = string(val), nil
		case num == reqStream:
			if err := want(num, typ, protowire.VarintType); err != nil {
				return err
			}
			r.Stream = v != 0
		case num == reqSampling:
			if err := want(num, typ, protowire.BytesType); err != nil {
				return err
			}
			return fields(val, func(num protowire.Number, typ protowire.Type, _ []byte, v uint64) error {
				if num != spMaxTokens {
					return nil
				}
				if err := want(num, typ, protowire.VarintType); err != nil {
					return fmt.Errorf("sampling_params: %w", err)
				}
				r.Sampling = &struct {
					MaxTokens uint64 `json:"max_tokens"`
				}{uint64(uint32(v))}
				return nil
			})
		}
		return nil
	})
}

// inputIDs reads TokenizedInput.input_ids, packed or not.
func inputIDs(msg []byte) ([]int, error) {
	var ids []int
	err := fields(msg, func(num protowire.Number, typ protowire.Type, val []byte, v uint64) error {
		if num != tokInputIDs {
			return nil
		}
		switch typ {
		case protowire.VarintType:
			ids = append(ids, int(uint32(v)))
		case protowire.BytesType:
			for len(val) > 0 {
				x, n := protowire.ConsumeVarint(val)
				if n < 0 {
					return fmt.Errorf("input_ids: %w", protowire.ParseError(n))
				}
				ids, val = append(ids, int(uint32(x))), val[n:]
			}
		default:
			return want(num, typ, protowire.VarintType)
		}
		return nil
	})
	return ids, err
}

var _ parsers.Parser = (*Parser)(nil)
