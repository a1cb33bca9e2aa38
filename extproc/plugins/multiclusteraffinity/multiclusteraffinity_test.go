package multiclusteraffinity

import (
	"context"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// route filters a request carrying headers, sends it to the cluster named
// to, and returns the kept names and the response's headers.
func route(t *testing.T, f *Filter, headers map[string]string, eps []*endpoints.Endpoint, to string) ([]string, map[string]string) {
	t.Helper()
	ctx := context.Background()
	cs := scheduling.NewCycleState()
	req := &scheduling.Request{Headers: headers}
	kept := schedtest.Names(f.Filter(ctx, cs, req, slices.Clone(eps)))
	for _, e := range eps {
		if e.Name() == to {
			f.PreRequest(ctx, cs, req, &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{e}}}})
		}
	}
	head := &scheduling.ResponseHead{Status: 200}
	f.ResponseHeader(ctx, cs, req, head)
	return kept, head.SetHeaders()
}

func TestFilter(t *testing.T) {
	a := schedtest.Endpoint("cluster-a", endpoints.Metrics{})
	b := schedtest.Endpoint("cluster-b", endpoints.Metrics{})
	c := schedtest.Endpoint("cluster-c", endpoints.Metrics{})
	all := []*endpoints.Endpoint{a, b, c}
	for _, tc := range []struct {
		name    string
		params  string
		headers map[string]string
		eps     []*endpoints.Endpoint
		want    []string
	}{
		{"token names a candidate", `{}`, map[string]string{"x-session-token": "Y2x1c3Rlci1i"}, all, []string{"cluster-b"}},
		{"no token keeps all", `{}`, nil, all, []string{"cluster-a", "cluster-b", "cluster-c"}},
		{"token of a cluster no longer a candidate keeps all", `{}`, map[string]string{"x-session-token": "Y2x1c3Rlci1i"}, []*endpoints.Endpoint{a, c}, []string{"cluster-a", "cluster-c"}},
		{"undecodable token keeps all", `{}`, map[string]string{"x-session-token": "!!"}, all, []string{"cluster-a", "cluster-b", "cluster-c"}},
		{"custom header", `{"encodedEndpointHeaderConfig":{"header":"X-Cluster"}}`, map[string]string{"x-cluster": "Y2x1c3Rlci1j"}, all, []string{"cluster-c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("aff", []byte(tc.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			got := schedtest.Names(p.(*Filter).Filter(context.Background(), scheduling.NewCycleState(), &scheduling.Request{Headers: tc.headers}, slices.Clone(tc.eps)))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

// The token the response carries pins the next request; session_id binds
// server-side and forgets a removed cluster.
func TestRoundTrip(t *testing.T) {
	a := schedtest.Endpoint("cluster-a", endpoints.Metrics{})
	b := schedtest.Endpoint("cluster-b", endpoints.Metrics{})
	all := []*endpoints.Endpoint{a, b}
	p, _ := New("aff", nil, nil)
	f := p.(*Filter)
	if f.TypedName().Type != Type || f.TypedName().Name != "aff" {
		t.Fatalf("typed name %v", f.TypedName())
	}
	kept, head := route(t, f, nil, all, "cluster-b")
	if len(kept) != 2 || head["x-session-token"] != "Y2x1c3Rlci1i" {
		t.Fatalf("first: kept %v, headers %v", kept, head)
	}
	if kept, _ := route(t, f, map[string]string{"x-session-token": head["x-session-token"]}, all, "cluster-b"); !slices.Equal(kept, []string{"cluster-b"}) {
		t.Fatalf("pinned: kept %v", kept)
	}

	p, _ = New("aff", []byte(`{"strategy":"session_id"}`), nil)
	f = p.(*Filter)
	sess := map[string]string{"x-session-id": "conv-1"}
	if kept, head := route(t, f, sess, all, "cluster-a"); len(kept) != 2 || len(head) != 0 {
		t.Fatalf("unbound: kept %v, headers %v", kept, head)
	}
	if kept, _ := route(t, f, sess, all, "cluster-a"); !slices.Equal(kept, []string{"cluster-a"}) {
		t.Fatalf("bound: kept %v", kept)
	}
	f.EndpointsRemoved([]string{a.Address()})
	if kept, _ := route(t, f, sess, all, "cluster-b"); len(kept) != 2 {
		t.Fatalf("after removal: kept %v", kept)
	}
}

func TestParams(t *testing.T) {
	for _, bad := range []string{`{"strategy":"cookie"}`, `{"unknown":1}`, `{"sessionIdConfig":{"sources":[{"attribute":"agent-identity"}]},"strategy":"session_id"}`} {
		if _, err := New("", []byte(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
