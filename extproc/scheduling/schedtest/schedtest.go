// Package schedtest has helpers for testing scheduling plugins: endpoints
// with given metrics, and running one scorer over them.
package schedtest

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Endpoint returns an endpoint named name at a made-up address derived from
// the name (distinct names get distinct addresses: per-endpoint state is
// keyed by address), holding m.
func Endpoint(name string, m endpoints.Metrics, labels ...string) *endpoints.Endpoint {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	n := h.Sum32()
	spec := endpoints.Spec{Name: name, Address: fmt.Sprintf("10.%d.%d.%d:8000", n>>16&0xff, n>>8&0xff, n&0xff), Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		spec.Labels[labels[i]] = labels[i+1]
	}
	e := endpoints.NewEndpoint(spec)
	e.SetMetrics(&m)
	return e
}

// Score runs s over eps and returns the scores.
func Score(s scheduling.Scorer, req *scheduling.Request, eps ...*endpoints.Endpoint) []float64 {
	out := make([]float64, len(eps))
	s.Score(context.Background(), scheduling.NewCycleState(), req, eps, out)
	return out
}

// Build constructs a plugin with factory f from JSON parameters, failing
// with a readable error.
func Build[T scheduling.Plugin](f scheduling.Factory, params string) (T, error) {
	var zero T
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := f("", raw, &scheduling.Handle{})
	if err != nil {
		return zero, err
	}
	t, ok := p.(T)
	if !ok {
		return zero, fmt.Errorf("factory built %T", p)
	}
	return t, nil
}

// ExpectScores fails the test unless got equals want within 1e-9.
func ExpectScores(t testing.TB, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
	for i := range got {
		if d := got[i] - want[i]; d > 1e-9 || d < -1e-9 {
			t.Fatalf("scores %v, want %v", got, want)
		}
	}
}

// Names is the endpoints' names in order, for comparing a filter's output.
func Names(eps []*endpoints.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name()
	}
	return out
}

// Pool is a fixed candidate set, the endpoint pool a director reads in
// tests.
type Pool []*endpoints.Endpoint

// Candidates returns every endpoint.
func (p Pool) Candidates() []*endpoints.Endpoint { return p }

// ByAddress returns the endpoint at addr, nil when none is.
func (p Pool) ByAddress(addr string) *endpoints.Endpoint {
	for _, e := range p {
		if e.Address() == addr {
			return e
		}
	}
	return nil
}
