package disagg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	Type   = "disagg-profile-handler"
	PDType = "pd-profile-handler"
)

// Default profile names, llm-d's.
const (
	DefaultDecodeProfile  = "decode"
	DefaultPrefillProfile = "prefill"
	DefaultEncodeProfile  = "encode"
	// DefaultPDDecider is pd-profile-handler's deciderPluginName default.
	DefaultPDDecider = "prefix-based-pd-decider"
)

// Decision types, the decision_type label of the decision metrics.
const (
	DecodeOnly          = "decode-only"
	PrefillDecode       = "prefill-decode"
	EncodeDecode        = "encode-decode"
	EncodePrefillDecode = "encode-prefill-decode"
)

// StageOrder is the order in which the handler runs its stages.
type StageOrder string

// Stage orders.
const (
	DecodeFirst  StageOrder = "decode-first"
	PrefillFirst StageOrder = "prefill-first"
)

// ParseStageOrder reads a stageOrder parameter as llm-d does: case, dashes
// and underscores do not matter, and the bare stage name is enough.
func ParseStageOrder(s string) (StageOrder, error) {
	switch strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(s)) {
	case "", "decodefirst", "decode":
		return DecodeFirst, nil
	case "prefillfirst", "prefill":
		return PrefillFirst, nil
	}
	return "", fmt.Errorf("parameters.stageOrder: %q is neither %q nor %q", s, DecodeFirst, PrefillFirst)
}

// Decider decides whether one disaggregation stage runs for a request.
// decode is the decode profile's pick in decode-first order, nil in
// prefill-first order (only the encode stage has a decider there).
type Decider interface {
	scheduling.Plugin
	Disaggregate(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, decode *endpoints.Endpoint) bool
}

// Recorder counts the handler's decisions; the picker's metrics implement it.
type Recorder interface {
	// DisaggDecision counts a disagg-profile-handler decision.
	DisaggDecision(plugin scheduling.TypedName, model, decision string)
	// PDDecision counts a pd-profile-handler decision.
	PDDecision(plugin scheduling.TypedName, model, decision string)
}

// ServiceRecorder is the handle service key of the Recorder; without one,
// decisions are not counted.
const ServiceRecorder = "disagg-recorder"

// PeerKey holds the earlier stage's pick, as llm-d's peer-endpoint
// attribute: the decode pick while the handler runs the encode and prefill
// profiles (decode-first), the prefill pick while it runs the encode and
// decode profiles (prefill-first, when the prefill profile chose one).
// The later profiles' plugins (topology-affinity-*) place their stage near
// it.
var PeerKey = scheduling.NewKey[*endpoints.Endpoint]("disagg-peer-endpoint")

type discard struct{}

func (discard) DisaggDecision(scheduling.TypedName, string, string) {}
func (discard) PDDecision(scheduling.TypedName, string, string)     {}

// Params are disagg-profile-handler's parameters: llm-d's nested form
// (profiles, deciders) and its deprecated flat form.
type Params struct {
	StageOrder string `json:"stageOrder"`
	Profiles   *struct {
		Decode  string `json:"decode"`
		Prefill string `json:"prefill"`
		Encode  string `json:"encode"`
	} `json:"profiles"`
	Deciders *struct {
		Prefill string `json:"prefill"`
		Encode  string `json:"encode"`
	} `json:"deciders"`
	DecodeProfile            string `json:"decodeProfile"`
	PrefillProfile           string `json:"prefillProfile"`
	EncodeProfile            string `json:"encodeProfile"`
	PrefillDeciderPluginName string `json:"prefillDeciderPluginName"`
	EncodeDeciderPluginName  string `json:"encodeDeciderPluginName"`
	DeciderPluginName        string `json:"deciderPluginName"`
}

// resolved is what the parameters say, in either form.
type resolved struct {
	decode, prefill, encode       string
	prefillDecider, encodeDecider string
}

// resolve reads the nested form, or the flat one with a deprecation log for
// each field in use; a mix of the two is an error.
func (p Params) resolve(log *slog.Logger) (resolved, error) {
	var r resolved
	flat := []struct {
		name, replacement, v string
		dst                  *string
	}{
		{"decodeProfile", "profiles.decode", p.DecodeProfile, &r.decode},
		{"prefillProfile", "profiles.prefill", p.PrefillProfile, &r.prefill},
		{"encodeProfile", "profiles.encode", p.EncodeProfile, &r.encode},
		{"prefillDeciderPluginName", "deciders.prefill", p.PrefillDeciderPluginName, &r.prefillDecider},
		// pd-profile-handler's name gives way to the newer flat one.
		{"deciderPluginName", "deciders.prefill", p.DeciderPluginName, &r.prefillDecider},
		{"encodeDeciderPluginName", "deciders.encode", p.EncodeDeciderPluginName, &r.encodeDecider},
	}
	nested := p.Profiles != nil || p.Deciders != nil
	for _, f := range flat {
		if f.v == "" {
			continue
		}
		if nested {
			return r, fmt.Errorf("parameters.%s (deprecated flat form) mixed with profiles/deciders: use one form", f.name)
		}
		log.Warn("deprecated parameter", "plugin", Type, "parameter", f.name, "use", f.replacement)
		if *f.dst == "" {
			*f.dst = f.v
		}
	}
	if p.Profiles != nil {
		r.decode, r.prefill, r.encode = p.Profiles.Decode, p.Profiles.Prefill, p.Profiles.Encode
	}
	if p.Deciders != nil {
		r.prefillDecider, r.encodeDecider = p.Deciders.Prefill, p.Deciders.Encode
	}
	return r, nil
}

// Handler implements disagg-profile-handler.
//
// Parameters:
//
//	stageOrder: string    decode-first (default) or prefill-first; also
//	                      decode, prefill, decodefirst, prefillfirst, in any
//	                      case, with - or _ anywhere
//	profiles: map         decode, prefill, encode: the stages' profile names
//	                      (default "decode", "prefill", "encode")
//	deciders: map         prefill, encode: the names of the stages'
//	                      decider plugins (a stage without one never runs)
//	decodeProfile: string  deprecated flat form of profiles.decode
//	prefillProfile: string  of profiles.prefill
//	encodeProfile: string  of profiles.encode
//	prefillDeciderPluginName: string  of deciders.prefill
//	deciderPluginName: string  likewise, giving way to the one above
//	encodeDeciderPluginName: string  of deciders.encode
//
// One configuration uses one form; the flat one loads with a deprecation
// log. Unlike llm-d, a decider named for a stage whose profile does not
// exist, and a profile no stage would ever run, are configuration errors
// rather than silently unused.
type Handler struct {
	scheduling.Named
	order                   StageOrder
	decode, prefill, encode string
	// prefillDecider and encodeDecider are the names configured; the
	// plugins are bound by Resolve.
	prefillDeciderName, encodeDeciderName string
	prefillDecider, encodeDecider         Decider
	// source, for pd-profile-handler's prefixMatchInfoProducerName, only
	// checks that the name is a prefix producer (kvgate orders producers
	// by their data without being told).
	sourceName string
	legacy     bool // pd-profile-handler: counted as llm_d_epp_pd_decision_total
	rec        Recorder
	key        scheduling.Key[*stages]
}

// stages is one request's progress through the stages.
type stages struct {
	encodeAsked, prefillAsked bool
	decided                   bool
}

// New is disagg-profile-handler's factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	log := logOf(h)
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	r, err := p.resolve(log)
	if err != nil {
		return nil, err
	}
	order, err := ParseStageOrder(p.StageOrder)
	if err != nil {
		return nil, err
	}
	if order == PrefillFirst && r.prefillDecider != "" {
		return nil, fmt.Errorf("parameters.deciders.prefill: the prefill stage has no decider in %s order (it always runs)", PrefillFirst)
	}
	hd := newHandler(Type, name, h, order, r.decode, r.prefill, r.encode)
	hd.prefillDeciderName, hd.encodeDeciderName = r.prefillDecider, r.encodeDecider
	if r.prefillDecider == "" && order == DecodeFirst {
		log.Info("no deciders.prefill: P/D disaggregation is off", "plugin", name)
	}
	return hd, nil
}

// PDParams are pd-profile-handler's parameters.
type PDParams struct {
	DecodeProfile               string `json:"decodeProfile"`
	PrefillProfile              string `json:"prefillProfile"`
	PrefixPluginType            string `json:"prefixPluginType"`
	PrefixPluginName            string `json:"prefixPluginName"`
	PrimaryPort                 int    `json:"primaryPort"`
	DeciderPluginName           string `json:"deciderPluginName"`
	PrefixMatchInfoProducerName string `json:"prefixMatchInfoProducerName"`
}

// PDHandler implements pd-profile-handler, the deprecated P/D-only form of
// disagg-profile-handler (decode-first, no encode stage), counted as
// llm_d_epp_pd_decision_total.
//
// Parameters:
//
//	decodeProfile: string   decode profile name (default "decode")
//	prefillProfile: string  prefill profile name (default "prefill")
//	deciderPluginName: string  the prefill decider (default
//	                        "prefix-based-pd-decider")
//	prefixMatchInfoProducerName: string  if set, must name a prefix producer
//	                        (kvgate orders producers by their data itself)
//	prefixPluginType: string  never used, in llm-d either: logged
//	prefixPluginName: string  likewise
//	primaryPort: int        refused: llm-d's data-parallel port rewrite
type PDHandler struct{ Handler }

// NewPD is pd-profile-handler's factory.
func NewPD(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	log := logOf(h)
	log.Warn("deprecated plugin type; use "+Type, "plugin", PDType)
	p := PDParams{DeciderPluginName: DefaultPDDecider}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.PrimaryPort != 0 {
		return nil, &scheduling.UnsupportedParameterError{Param: "primaryPort",
			Reason: "llm-d's data-parallel port rewrite (deprecated: not needed with Istio >= 1.28.1); route each data-parallel rank as its own endpoint"}
	}
	if p.PrefixPluginType != "" || p.PrefixPluginName != "" {
		log.Warn("parameters prefixPluginType / prefixPluginName are unused (as in llm-d)", "plugin", PDType)
	}
	if p.DeciderPluginName == "" {
		return nil, errors.New("parameters.deciderPluginName must name a decider")
	}
	hd := newHandler(PDType, name, h, DecodeFirst, p.DecodeProfile, p.PrefillProfile, "")
	hd.prefillDeciderName, hd.sourceName, hd.legacy = p.DeciderPluginName, p.PrefixMatchInfoProducerName, true
	return &PDHandler{*hd}, nil
}

func newHandler(typ, name string, h *scheduling.Handle, order StageOrder, decode, prefill, encode string) *Handler {
	hd := &Handler{
		Named:   scheduling.NewNamed(typ, name),
		order:   order,
		decode:  cmp(decode, DefaultDecodeProfile),
		prefill: cmp(prefill, DefaultPrefillProfile),
		encode:  cmp(encode, DefaultEncodeProfile),
		rec:     discard{},
	}
	if typ == PDType {
		// pd-profile-handler has no encode stage.
		hd.encode = ""
	}
	if r, ok := scheduling.Service[Recorder](h, ServiceRecorder); ok && r != nil {
		hd.rec = r
	}
	hd.key = scheduling.NewKey[*stages](hd.TypedName().String())
	return hd
}

func cmp(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func logOf(h *scheduling.Handle) *slog.Logger {
	if h != nil && h.Log != nil {
		return h.Log
	}
	return slog.Default()
}

// Resolve implements scheduling.Resolver: deciders may be configured after
// the handler.
func (h *Handler) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	var err error
	param := "deciders.prefill"
	if h.legacy {
		param = "deciderPluginName"
	}
	if h.prefillDecider, err = resolveDecider(lookup, param, h.prefillDeciderName); err != nil {
		return err
	}
	if h.encodeDecider, err = resolveDecider(lookup, "deciders.encode", h.encodeDeciderName); err != nil {
		return err
	}
	if h.sourceName != "" {
		if _, err := prefixmatch.ResolveSource(lookup, "prefixMatchInfoProducerName", h.sourceName); err != nil {
			return err
		}
	}
	return nil
}

func resolveDecider(lookup func(string) (scheduling.Plugin, bool), param, name string) (Decider, error) {
	if name == "" {
		return nil, nil
	}
	return scheduling.LookupAs[Decider](lookup, param, name, "a disaggregation decider")
}

// ValidateProfiles implements scheduling.ProfileValidator: the decode
// profile must exist, a decider's stage must have its profile, and every
// profile must be one a stage can run.
func (h *Handler) ValidateProfiles(names []string) error {
	if !slices.Contains(names, h.decode) {
		return fmt.Errorf("%s needs the decode profile %q (profiles: %v)", h.TypedName().Type, h.decode, names)
	}
	if h.prefillDeciderName != "" && !slices.Contains(names, h.prefill) {
		return fmt.Errorf("%s: the prefill decider %q is set but there is no prefill profile %q", h.TypedName().Type, h.prefillDeciderName, h.prefill)
	}
	if h.encodeDeciderName != "" && !slices.Contains(names, h.encode) {
		return fmt.Errorf("%s: the encode decider %q is set but there is no encode profile %q", h.TypedName().Type, h.encodeDeciderName, h.encode)
	}
	for _, n := range names {
		switch {
		case n == h.decode:
		case n == h.prefill && (h.prefillDeciderName != "" || h.order == PrefillFirst):
		case n == h.encode && h.encodeDeciderName != "":
		case n == h.prefill:
			return fmt.Errorf("%s: profile %q never runs: set deciders.prefill (or stageOrder prefill-first)", h.TypedName().Type, n)
		case n == h.encode:
			return fmt.Errorf("%s: profile %q never runs: set deciders.encode", h.TypedName().Type, n)
		default:
			return fmt.Errorf("%s: profile %q is none of its decode, prefill and encode profiles (%q, %q, %q)", h.TypedName().Type, n, h.decode, h.prefill, h.encode)
		}
	}
	return nil
}

// Pick implements scheduling.ProfileHandler, one stage per call.
func (h *Handler) Pick(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	st, ok := scheduling.Read(cs, h.key)
	if !ok {
		st = &stages{}
		scheduling.Write(cs, h.key, st)
	}
	if h.order == PrefillFirst {
		return h.pickPrefillFirst(ctx, cs, req, st, profiles, results)
	}
	if _, ran := results[h.decode]; !ran {
		return one(profiles[h.decode])
	}
	decode := first(results[h.decode])
	if decode == nil {
		return nil // the request fails with the decode profile's error
	}
	scheduling.Write(cs, PeerKey, decode)
	if p := profiles[h.encode]; p != nil && h.encodeDecider != nil && !st.encodeAsked {
		st.encodeAsked = true
		if h.encodeDecider.Disaggregate(ctx, cs, req, decode) {
			return one(p)
		}
	}
	if p := profiles[h.prefill]; p != nil && h.prefillDecider != nil && !st.prefillAsked {
		st.prefillAsked = true
		if h.prefillDecider.Disaggregate(ctx, cs, req, decode) {
			return one(p)
		}
	}
	h.record(st, req, results)
	return nil
}

func (h *Handler) pickPrefillFirst(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, st *stages, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	if _, ran := results[h.decode]; ran {
		if first(results[h.decode]) != nil {
			h.record(st, req, results)
		}
		return nil
	}
	if p := profiles[h.prefill]; p != nil {
		if _, ran := results[h.prefill]; !ran {
			return one(p)
		}
		if pf := first(results[h.prefill]); pf != nil {
			scheduling.Write(cs, PeerKey, pf)
		}
	}
	if p := profiles[h.encode]; p != nil && h.encodeDecider != nil && !st.encodeAsked {
		st.encodeAsked = true
		if h.encodeDecider.Disaggregate(ctx, cs, req, nil) {
			return one(p)
		}
	}
	return one(profiles[h.decode])
}

// record counts the decision once the stages are done.
func (h *Handler) record(st *stages, req *scheduling.Request, results map[string]*scheduling.ProfileResult) {
	if st.decided {
		return
	}
	st.decided = true
	d := DecisionType(first(results[h.encode]) != nil, first(results[h.prefill]) != nil)
	if h.legacy {
		h.rec.PDDecision(h.TypedName(), req.TargetModel, d)
		return
	}
	h.rec.DisaggDecision(h.TypedName(), req.TargetModel, d)
}

// DecisionType names the stages used.
func DecisionType(encode, prefill bool) string {
	switch {
	case encode && prefill:
		return EncodePrefillDecode
	case encode:
		return EncodeDecode
	case prefill:
		return PrefillDecode
	}
	return DecodeOnly
}

func one(p *scheduling.Profile) []*scheduling.Profile {
	if p == nil {
		return nil
	}
	return []*scheduling.Profile{p}
}

// first is a profile's primary pick; nil when it ran and picked nothing
// (or did not run).
func first(r *scheduling.ProfileResult) *endpoints.Endpoint {
	if r == nil || len(r.Targets) == 0 {
		return nil
	}
	return r.Targets[0]
}

// ProcessResults implements scheduling.ProfileHandler: decode is primary;
// the other stages that picked an endpoint come along for the headers.
func (h *Handler) ProcessResults(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, results map[string]*scheduling.ProfileResult) (*scheduling.Result, error) {
	out := &scheduling.Result{PrimaryProfile: h.decode, Profiles: make(map[string]*scheduling.ProfileResult, 3)}
	// A decode profile that picked nothing leaves the primary empty: the
	// scheduler then fails the request with that profile's own error.
	for _, n := range []string{h.decode, h.prefill, h.encode} {
		if r := results[n]; n != "" && first(r) != nil {
			out.Profiles[n] = r
		}
	}
	if p := first(out.Profiles[h.prefill]); p != nil && p != first(out.Profiles[h.decode]) {
		out.Prefill = p
	}
	return out, nil
}

// PreRequest implements scheduling.PreRequest: the decode pod's sidecar
// learns the prefill and encode servers.
func (h *Handler) PreRequest(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	SetHeaders(res, h.prefill, h.encode)
}

var (
	_ scheduling.ProfileHandler   = (*Handler)(nil)
	_ scheduling.ProfileValidator = (*Handler)(nil)
	_ scheduling.Resolver         = (*Handler)(nil)
	_ scheduling.PreRequest       = (*Handler)(nil)
)
