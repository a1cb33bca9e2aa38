// Package attrreporter is GIE's request-attribute-reporter: at the end of
// each routed response it computes a value from the response's token usage
// with a CEL expression and reports it to the proxy as ext_proc dynamic
// metadata (namespace envoy.lb by default), for cost accounting, quotas or
// load balancing in the proxy. The expression sees usage, a
// google.protobuf.Struct of the response's usage (prompt_tokens,
// completion_tokens, total_tokens, prompt_tokens_details.cached_tokens),
// empty when the response carried none, so that has(usage.prompt_tokens)
// tests for it. The optional condition must be true for a value to be
// reported; the expression's result must be a number and is reported as an
// integer; zero, as in GIE, is not reported. Evaluation errors are logged
// and report nothing. As in GIE, exactly one attribute is configured.
//
// Parameters:
//
//	attributes: []  exactly one {key: {namespace (envoy.lb), name}, expression, condition}
package attrreporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/cel-go/cel"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "request-attribute-reporter"

// DefaultNamespace is the metadata namespace when the key names none.
const DefaultNamespace = "envoy.lb"

// costLimit bounds one evaluation: a usage expression is a handful of
// field reads and arithmetic.
const costLimit = 10_000

// Params are the plugin's parameters.
type Params struct {
	Attributes []Attribute `json:"attributes"`
}

// Attribute is one reported value.
type Attribute struct {
	Key        Key    `json:"key"`
	Expression string `json:"expression"`
	Condition  string `json:"condition"`
}

// Key is where the value goes in the dynamic metadata.
type Key struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Reporter implements request-attribute-reporter.
type Reporter struct {
	scheduling.Named
	key        Key
	expression cel.Program
	condition  cel.Program // nil: always
	log        *slog.Logger
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if len(p.Attributes) != 1 {
		return nil, fmt.Errorf("parameters.attributes must hold exactly one attribute, got %d", len(p.Attributes))
	}
	a := p.Attributes[0]
	if a.Key.Name == "" {
		return nil, errors.New("parameters.attributes[0].key.name is required")
	}
	if a.Expression == "" {
		return nil, errors.New("parameters.attributes[0].expression is required")
	}
	if a.Key.Namespace == "" {
		a.Key.Namespace = DefaultNamespace
	}
	env, err := cel.NewEnv(cel.Variable("usage", cel.ObjectType("google.protobuf.Struct")))
	if err != nil {
		return nil, err
	}
	r := &Reporter{Named: scheduling.NewNamed(Type, name), key: a.Key, log: slog.Default()}
	if h != nil && h.Log != nil {
		r.log = h.Log
	}
	if r.expression, err = compile(env, a.Expression); err != nil {
		return nil, fmt.Errorf("parameters.attributes[0].expression: %w", err)
	}
	if a.Condition != "" {
		if r.condition, err = compile(env, a.Condition); err != nil {
			return nil, fmt.Errorf("parameters.attributes[0].condition: %w", err)
		}
	}
	return r, nil
}

func compile(env *cel.Env, src string) (cel.Program, error) {
	ast, iss := env.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, iss.Err()
	}
	return env.Program(ast, cel.CostLimit(costLimit))
}

// usageStruct is usage as the expressions see it.
func usageStruct(u *openai.Usage) *structpb.Struct {
	if u == nil {
		return &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	s, _ := structpb.NewStruct(map[string]any{ // numbers and maps only: cannot fail
		"prompt_tokens":         u.PromptTokens,
		"completion_tokens":     u.CompletionTokens,
		"total_tokens":          u.PromptTokens + u.CompletionTokens,
		"prompt_tokens_details": map[string]any{"cached_tokens": u.CachedTokens},
	})
	return s
}

// Value is the value reported for usage; ok is false when nothing is.
func (r *Reporter) Value(u *openai.Usage) (v int64, ok bool, err error) {
	vars := map[string]any{"usage": usageStruct(u)}
	if r.condition != nil {
		out, _, err := r.condition.Eval(vars)
		if err != nil {
			return 0, false, fmt.Errorf("condition: %w", err)
		}
		if b, isBool := out.Value().(bool); !isBool || !b {
			return 0, false, nil
		}
	}
	out, _, err := r.expression.Eval(vars)
	if err != nil {
		return 0, false, fmt.Errorf("expression: %w", err)
	}
	switch x := out.Value().(type) {
	case float64:
		v = int64(x)
	case int64:
		v = x
	case uint64:
		v = int64(x)
	default:
		return 0, false, fmt.Errorf("expression: result %v (%T) is not a number", x, x)
	}
	return v, v != 0, nil
}

// ResponseMetadata implements scheduling.ResponseMetadata.
func (r *Reporter) ResponseMetadata(ctx context.Context, _ *scheduling.CycleState, req *scheduling.Request, u *openai.Usage, md scheduling.Metadata) {
	v, ok, err := r.Value(u)
	if err != nil {
		r.log.LogAttrs(ctx, slog.LevelWarn, "request attribute not reported", slog.String("plugin", r.TypedName().String()),
			slog.String("request_id", req.ID), slog.Any("error", err))
		return
	}
	if ok {
		md.Set(r.key.Namespace, r.key.Name, float64(v))
	}
}

var _ scheduling.ResponseMetadata = (*Reporter)(nil)
