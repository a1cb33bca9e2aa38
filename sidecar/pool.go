package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// pool is the SSRF allowlist: the InferencePool's members as the picker's
// own discovery learns them (package endpoints with a static file or
// Kubernetes source), so the sidecar dials exactly the servers the picker
// may choose, at their ip:port. A prefill target that is not a member is
// refused with 403; encoders that are not are dropped; a KV source that
// is not is ignored. Membership may change while the sidecar runs; each
// check reads the current set.
type pool struct {
	ds     *endpoints.Datastore
	src    endpoints.Source // nil: protection off, every target allowed
	loaded atomic.Bool      // the source has applied a set
}

func newPool(src endpoints.Source) *pool {
	return &pool{ds: endpoints.NewDatastore(), src: src}
}

// enabled reports whether targets are checked at all.
func (p *pool) enabled() bool { return p.src != nil }

// run follows the source until ctx ends.
func (p *pool) run(ctx context.Context, log *slog.Logger) error {
	if p.src == nil {
		<-ctx.Done()
		return nil
	}
	err := p.src.Run(ctx, func(specs []endpoints.Spec) error {
		if err := p.ds.Replace(specs); err != nil {
			return err
		}
		if !p.loaded.Swap(true) {
			log.Info("SSRF protection: pool membership loaded", "endpoints", len(specs))
		}
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("pool membership (SSRF protection): %w", err)
	}
	return nil
}

// errNotMember and errPoolUnknown say why a target was refused.
var (
	errNotMember   = errors.New("not a member of the inference pool")
	errPoolUnknown = errors.New("the inference pool's membership is not known yet")
)

// check returns the normalised target when it may be dialled.
func (p *pool) check(hostPort string) (string, error) {
	hp, err := parseHostPort(hostPort)
	if err != nil {
		return "", err
	}
	if p.src == nil {
		return hp, nil
	}
	if !p.loaded.Load() {
		return "", errPoolUnknown
	}
	// ByAddress reads every spelling of an IP address as one (an IPv6
	// address in upper case, an IPv4-mapped one).
	if p.ds.ByAddress(hp) == nil {
		return "", fmt.Errorf("%s: %w", hp, errNotMember)
	}
	return hp, nil
}
