// Package profilehandler holds the profile handlers that decide which
// scheduling profiles run for a request and which result is primary.
package profilehandler

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// SingleType is the registered type of the single-profile handler.
const SingleType = "single-profile-handler"

// Single runs the configuration's only profile; its result is primary.
//
// Parameters: none.
type Single struct{ scheduling.Named }

// NewSingle is the plugin factory.
func NewSingle(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(SingleType, name, params)
	if err != nil {
		return nil, err
	}
	return &Single{n}, nil
}

// Pick implements scheduling.ProfileHandler.
func (s *Single) Pick(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	if len(results) > 0 {
		return nil
	}
	for _, p := range profiles {
		return scheduling.OneProfile(cs, p)
	}
	return nil
}

// ProcessResults implements scheduling.ProfileHandler.
func (s *Single) ProcessResults(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, results map[string]*scheduling.ProfileResult) (*scheduling.Result, error) {
	if res := OnlyResult(cs, results); res != nil {
		return res, nil
	}
	return nil, fmt.Errorf("%s: no profile ran", SingleType)
}

// OnlyResult is the result of a handler that runs one profile: the profile
// that ran is primary; nil when none ran.
func OnlyResult(cs *scheduling.CycleState, results map[string]*scheduling.ProfileResult) *scheduling.Result {
	for name := range results {
		res := scheduling.NewResult(cs)
		res.PrimaryProfile, res.Profiles = name, results
		return res
	}
	return nil
}

// ValidateProfiles implements scheduling.ProfileValidator.
func (s *Single) ValidateProfiles(names []string) error {
	if len(names) != 1 {
		return fmt.Errorf("%s needs exactly one scheduling profile, the configuration has %d %v", SingleType, len(names), names)
	}
	return nil
}
