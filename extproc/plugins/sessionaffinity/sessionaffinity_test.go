package sessionaffinity

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func build(t *testing.T, params string, c *clock) *Scorer {
	t.Helper()
	p, err := New("", []byte(params), &scheduling.Handle{Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Scorer)
}

// route scores a request carrying headers and sends it to eps[to] (in
// profile "decode", the primary, and "prefill" to eps[prefill] when >= 0).
func route(t *testing.T, s *Scorer, headers map[string]string, eps []*endpoints.Endpoint, to, prefill int) []float64 {
	t.Helper()
	cs := scheduling.NewCycleState()
	req := &scheduling.Request{Headers: headers}
	scores := make([]float64, len(eps))
	s.Score(context.Background(), cs, req, eps, scores)
	res := &scheduling.Result{PrimaryProfile: "decode", Profiles: map[string]*scheduling.ProfileResult{"decode": {Targets: []*endpoints.Endpoint{eps[to]}}}}
	if prefill >= 0 {
		res.Profiles["prefill"] = &scheduling.ProfileResult{Targets: []*endpoints.Endpoint{eps[prefill]}}
	}
	s.PreRequest(context.Background(), cs, req, res)
	return scores
}

func TestSessionBinding(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := build(t, `{"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 60, "evictionSweepSeconds": 1}}`, c)
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	sess := map[string]string{"x-session-id": "conv-1"}
	// Unknown session: no preference; bound to where it went.
	schedtest.ExpectScores(t, route(t, s, sess, eps, 1, -1), []float64{0, 0})
	schedtest.ExpectScores(t, route(t, s, sess, eps, 0, -1), []float64{0, 1})
	// The binding follows the last routing, and other sessions are apart.
	schedtest.ExpectScores(t, route(t, s, sess, eps, 0, -1), []float64{1, 0})
	schedtest.ExpectScores(t, route(t, s, map[string]string{"x-session-id": "conv-2"}, eps, 0, -1), []float64{0, 0})
	// No session header: nothing bound.
	schedtest.ExpectScores(t, route(t, s, nil, eps, 1, -1), []float64{0, 0})
	if s.Sessions() != 2 {
		t.Fatalf("%d sessions, want 2", s.Sessions())
	}
	// Its endpoint not a candidate: no preference.
	schedtest.ExpectScores(t, route(t, s, sess, eps[1:], 0, -1), []float64{0})
	// Unused past the TTL: forgotten (and swept).
	c.t = c.t.Add(61 * time.Second)
	schedtest.ExpectScores(t, route(t, s, sess, eps, 0, -1), []float64{0, 0})
	if s.Sessions() != 1 {
		t.Fatalf("%d sessions after the sweep, want 1 (conv-1 rebound)", s.Sessions())
	}
	s.EndpointsRemoved([]string{eps[0].Address()})
	if s.Sessions() != 0 {
		t.Fatal("a session bound to a removed endpoint kept")
	}
}

// Sources are tried in order; profileName binds to that profile's target.
func TestSourcesAndProfile(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := build(t, `{"strategy": "session_id", "profileName": "prefill", "sessionIdConfig": {"sources": [{"header": "X-Conversation"}, {"header": "x-session-id"}]}}`, c)
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	route(t, s, map[string]string{"x-conversation": "c1", "x-session-id": "other"}, eps, 0, 1)
	schedtest.ExpectScores(t, route(t, s, map[string]string{"x-conversation": "c1"}, eps, 0, 1), []float64{0, 1})
	schedtest.ExpectScores(t, route(t, s, map[string]string{"x-session-id": "other"}, eps, 0, 1), []float64{0, 0})
}

func TestParams(t *testing.T) {
	var unsupported *scheduling.UnsupportedParameterError
	for params, want := range map[string]string{
		`{"strategy": "session_id", "sessionIdConfig": {"sources": [{"attribute": "agent-identity"}]}}`: "attribute",
	} {
		if _, err := New("", []byte(params), nil); !errors.As(err, &unsupported) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want an unsupported-parameter error naming %q", params, err, want)
		}
	}
	for _, params := range []string{
		`{"strategy": "sticky"}`,
		`{"strategy": "session_id", "encodedEndpointHeaderConfig": {"header": "x"}}`,
		`{"sessionIdConfig": {"evictionTtlSeconds": 5}}`,
		`{"strategy": "session_id", "sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]}}`,
		`{"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 0}}`,
		`{"strategy": "session_id", "sessionIdConfig": {"evictionSweepSeconds": -1}}`,
		// Past a time.Duration: read as a negative TTL, no binding would last.
		`{"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 1e12}}`,
	} {
		if _, err := New("", []byte(params), nil); err == nil {
			t.Errorf("%s accepted", params)
		}
	}
}

// llm-d's default strategy: the endpoint chosen goes back as a base64
// token in x-session-token (or the configured header), and a request
// carrying it prefers that endpoint; no state is kept.
func TestEncodedEndpointHeader(t *testing.T) {
	for _, tc := range []struct{ params, header string }{{`{}`, "x-session-token"}, {`{"encodedEndpointHeaderConfig": {"header": "X-Mine"}}`, "x-mine"}} {
		s := build(t, tc.params, &clock{t: time.Unix(1, 0)})
		a := schedtest.Endpoint("a", endpoints.Metrics{})
		b := schedtest.Endpoint("b", endpoints.Metrics{}, "namespace", "llm")
		eps := []*endpoints.Endpoint{a, b}
		ctx := context.Background()
		// No token: no preference. The choice (b) is returned as a token.
		cs := scheduling.NewCycleState()
		req := &scheduling.Request{Headers: map[string]string{}}
		scores := make([]float64, 2)
		s.Score(ctx, cs, req, eps, scores)
		schedtest.ExpectScores(t, scores, []float64{0, 0})
		s.PreRequest(ctx, cs, req, &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{b}}}})
		head := &scheduling.ResponseHead{Status: 200}
		s.ResponseHeader(ctx, cs, req, head)
		tok := head.SetHeaders()[tc.header]
		if tok != "bGxtL2I=" { // base64("llm/b"), as llm-d encodes namespace/name
			t.Fatalf("%s: token %q", tc.params, tok)
		}
		// The next request carries the token.
		scores = make([]float64, 2)
		s.Score(ctx, scheduling.NewCycleState(), &scheduling.Request{Headers: map[string]string{tc.header: tok}}, eps, scores)
		schedtest.ExpectScores(t, scores, []float64{0, 1})
		for _, bad := range []string{"!!!", "YQ=="} {
			scores = make([]float64, 2)
			s.Score(ctx, scheduling.NewCycleState(), &scheduling.Request{Headers: map[string]string{tc.header: bad}}, eps, scores)
			want := []float64{0, 0}
			if bad == "YQ==" {
				want = []float64{1, 0} // "a": an endpoint without a namespace is named alone
			}
			schedtest.ExpectScores(t, scores, want)
		}
		if s.Sessions() != 0 {
			t.Fatal("the stateless strategy kept sessions")
		}
	}
}
