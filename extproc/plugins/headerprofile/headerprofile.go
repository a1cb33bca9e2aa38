// Package headerprofile is llm-d's header-profile-handler: each request runs
// exactly one scheduling profile, the one a request header names. It serves
// llm-d's coordinator, which makes one scheduling call per stage (encode,
// prefill, decode) and already knows which stage each call is for.
//
// With one profile configured, that profile always runs, whatever the
// header says. Otherwise the header's value (trimmed, matched case
// sensitively) names the profile; a missing or blank header runs
// defaultProfile; a value naming no profile fails the request, as does a
// missing header when defaultProfile is not configured.
//
// Parameters:
//
//	headerName: string      the header naming the profile (default
//	                        "EPP-Profile"; case does not matter)
//	defaultProfile: string  the profile run without the header (default
//	                        "decode")
package headerprofile

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/extproc/plugins/profilehandler"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "header-profile-handler"

// Defaults, llm-d's.
const (
	DefaultHeader  = "EPP-Profile"
	DefaultProfile = "decode"
)

// Params are the handler's parameters.
type Params struct {
	HeaderName     string `json:"headerName"`
	DefaultProfile string `json:"defaultProfile"`
}

// Handler implements header-profile-handler.
type Handler struct {
	scheduling.Named
	header, fallback string
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	// Request headers reach the picker with lowercase names.
	header := strings.ToLower(strings.TrimSpace(p.HeaderName))
	if header == "" {
		header = strings.ToLower(DefaultHeader)
	}
	fallback := strings.TrimSpace(p.DefaultProfile)
	if fallback == "" {
		fallback = DefaultProfile
	}
	return &Handler{Named: scheduling.NewNamed(Type, name), header: header, fallback: fallback}, nil
}

func (h *Handler) value(req *scheduling.Request) string {
	if req == nil {
		return ""
	}
	return strings.TrimSpace(req.Headers[h.header])
}

// Pick implements scheduling.ProfileHandler.
func (h *Handler) Pick(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	if len(results) > 0 {
		return nil
	}
	if len(profiles) == 1 {
		for _, p := range profiles {
			return scheduling.OneProfile(cs, p)
		}
	}
	name := h.value(req)
	if name == "" {
		name = h.fallback
	}
	if p, ok := profiles[name]; ok {
		return scheduling.OneProfile(cs, p)
	}
	return nil
}

// ProcessResults implements scheduling.ProfileHandler: the profile that ran
// is primary; none ran when the header named no profile.
func (h *Handler) ProcessResults(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, results map[string]*scheduling.ProfileResult) (*scheduling.Result, error) {
	if res := profilehandler.OnlyResult(cs, results); res != nil {
		return res, nil
	}
	if v := h.value(req); v != "" {
		return nil, fmt.Errorf("%s: no scheduling profile %q (header %s)", Type, v, h.header)
	}
	return nil, fmt.Errorf("%s: no %s header and no default profile %q", Type, h.header, h.fallback)
}

var _ scheduling.ProfileHandler = (*Handler)(nil)
