package disagg

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// Deprecated PreRequest plugin types that set the headers (llm-d plans their
// removal for v0.11; disagg-profile-handler sets them itself).
const (
	HeadersType       = "disagg-headers-handler"
	PrefillHeaderType = "prefill-header-handler"
)

// SetHeaders names the prefill profile's primary pick in
// x-prefiller-host-port and every encode pick in x-encoder-hosts-ports. A
// stage that did not run, or picked nothing, sets no header: the picker
// removes any copy the client sent (extproc/server), so the sidecar then
// runs that stage locally.
func SetHeaders(res *scheduling.Result, prefillProfile, encodeProfile string) {
	if res == nil {
		return
	}
	if p := first(res.Profiles[prefillProfile]); p != nil {
		res.SetHeader(eppwire.HeaderPrefiller, p.Address())
	}
	if r := res.Profiles[encodeProfile]; encodeProfile != "" && r != nil && len(r.Targets) > 0 {
		addrs := make([]string, len(r.Targets))
		for i, e := range r.Targets {
			addrs[i] = e.Address()
		}
		res.SetHeader(eppwire.HeaderEncoders, strings.Join(addrs, ","))
	}
}

// HeadersHandler implements the deprecated disagg-headers-handler and
// prefill-header-handler.
//
// Parameters:
//
//	prefillProfile: string  the prefill profile (default "prefill")
//	encodeProfile: string   the encode profile (default "encode")
type HeadersHandler struct {
	scheduling.Named
	prefill, encode string
}

// HeadersParams are the header handlers' parameters.
type HeadersParams struct {
	PrefillProfile string `json:"prefillProfile"`
	EncodeProfile  string `json:"encodeProfile"`
}

func headersFactory(typ string) scheduling.Factory {
	return func(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
		p := HeadersParams{PrefillProfile: DefaultPrefillProfile, EncodeProfile: DefaultEncodeProfile}
		if err := scheduling.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		logOf(h).Warn("deprecated plugin type: "+Type+" sets the P/D headers itself", "plugin", typ)
		return &HeadersHandler{Named: scheduling.NewNamed(typ, name), prefill: p.PrefillProfile, encode: p.EncodeProfile}, nil
	}
}

// Factories of the deprecated header handlers.
var (
	NewHeaders       = headersFactory(HeadersType)
	NewPrefillHeader = headersFactory(PrefillHeaderType)
)

// PreRequest implements scheduling.PreRequest.
func (p *HeadersHandler) PreRequest(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	SetHeaders(res, p.prefill, p.encode)
}

var _ scheduling.PreRequest = (*HeadersHandler)(nil)
