// Package dataparallel is llm-d's data-parallel-profile-handler (deprecated
// there in favour of single-profile-handler with Istio >= 1.28.1): each
// data-parallel rank of a model server is an endpoint of its own (pod
// address, rank port), the configuration's one profile picks a rank, and
// the request is sent to the pod's primary port with the rank's ip:port in
// x-data-parallel-host-port, where llm-d's routing sidecar forwards it to
// the rank. Load stays charged to the rank that was picked.
//
// Parameters:
//
//	primaryPort: int  the pod port requests are sent to, 1-65535 (default 8000)
package dataparallel

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/kvgate/kvgate/extproc/plugins/profilehandler"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// Type is the registered plugin type.
const Type = "data-parallel-profile-handler"

// DefaultPrimaryPort is llm-d's default primaryPort.
const DefaultPrimaryPort = 8000

// Params are the plugin's parameters.
type Params struct {
	PrimaryPort *int `json:"primaryPort"`
}

// Handler implements data-parallel-profile-handler.
type Handler struct {
	scheduling.Named
	// single runs the only profile; Handler rewrites its result.
	single *profilehandler.Single
	port   int
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	port := DefaultPrimaryPort
	if p.PrimaryPort != nil {
		port = *p.PrimaryPort
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("parameters.primaryPort must be between 1 and 65535, got %d", port)
	}
	if h != nil && h.Log != nil {
		h.Log.Warn("deprecated plugin type (as in llm-d); use single-profile-handler with Istio >= 1.28.1",
			slog.String("plugin", Type))
	}
	single, err := profilehandler.NewSingle(name, nil, h)
	if err != nil {
		return nil, err
	}
	return &Handler{Named: scheduling.NewNamed(Type, name), single: single.(*profilehandler.Single), port: port}, nil
}

// Pick implements scheduling.ProfileHandler: the only profile, once.
func (d *Handler) Pick(ctx context.Context, cs *scheduling.CycleState, r *scheduling.Request, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	return d.single.Pick(ctx, cs, r, profiles, results)
}

// ProcessResults implements scheduling.ProfileHandler: the rank picked is
// named in x-data-parallel-host-port and the request goes to its pod's
// primary port. A profile that picked nothing is passed on without a
// primary, so that the scheduler fails the cycle with the profile's own
// error, as under single-profile-handler.
func (d *Handler) ProcessResults(ctx context.Context, cs *scheduling.CycleState, r *scheduling.Request, results map[string]*scheduling.ProfileResult) (*scheduling.Result, error) {
	res, err := d.single.ProcessResults(ctx, cs, r, results)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Type, err)
	}
	primary := res.Primary()
	if primary == nil || len(primary.Targets) == 0 {
		return res, nil
	}
	res.SetHeader(eppwire.HeaderDataParallel, primary.Targets[0].Address())
	res.DestinationPort = d.port
	return res, nil
}

// ValidateProfiles implements scheduling.ProfileValidator: exactly one
// profile, as in llm-d.
func (d *Handler) ValidateProfiles(names []string) error {
	if len(names) != 1 {
		return fmt.Errorf("%s needs exactly one scheduling profile, the configuration has %d %v", Type, len(names), names)
	}
	return nil
}
