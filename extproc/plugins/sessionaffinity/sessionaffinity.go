// Package sessionaffinity is llm-d's session-affinity-scorer with its
// session_id strategy: the client names its session (by default in the
// x-session-id header); the picker remembers which endpoint served the
// session and scores that endpoint 1 and every other 0 on the session's
// next request, a soft preference other scorers can outweigh. An unknown
// session, or one whose endpoint is no candidate, expresses no preference
// (all 0) and is bound to wherever the request goes. Bindings unused for
// evictionTtlSeconds are dropped; the table is bounded, least recently
// used first out.
//
// llm-d's default strategy, encoded_endpoint_header, keeps no state: the
// picker returns the endpoint it chose to the client in a response header
// (x-session-token by default: base64 of the endpoint's id, llm-d's
// "<namespace>/<name>" when discovery knows the namespace, else its name),
// and a request carrying the token scores that endpoint 1. Attribute
// sources (values published by other plugins, such as agent-identity) are
// refused: no kvgate plugin publishes request attributes.
//
// Parameters (llm-d's names):
//
//	strategy: string        encoded_endpoint_header (llm-d's default) or
//	                        session_id
//	profileName: string     profile whose target a session binds to (default:
//	                        the primary profile's)
//	sessionIdConfig: object  sources (list of {header}, first non-empty wins;
//	                        default x-session-id), evictionTtlSeconds (300),
//	                        evictionSweepSeconds (10)
//	encodedEndpointHeaderConfig: object  header (x-session-token), for
//	                        encoded_endpoint_header
package sessionaffinity

import (
	"container/list"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// Type is the registered plugin type.
const Type = "session-affinity-scorer"

// Strategies and defaults, as llm-d names them.
const (
	StrategySessionID      = "session_id"
	StrategyEncodedHeader  = "encoded_endpoint_header"
	DefaultSessionHeader   = "x-session-id"
	DefaultEvictionTTL     = 300 * time.Second
	DefaultEvictionSweep   = 10 * time.Second
	MaxSessions            = 1 << 20
	maxSessionIDBytes      = 1024
	defaultProfileMeansAny = ""
)

// Params are the plugin's parameters.
type Params struct {
	Strategy                    string                       `json:"strategy"`
	ProfileName                 string                       `json:"profileName"`
	SessionIDConfig             *SessionIDConfig             `json:"sessionIdConfig"`
	EncodedEndpointHeaderConfig *EncodedEndpointHeaderConfig `json:"encodedEndpointHeaderConfig"`
}

// EncodedEndpointHeaderConfig configures the encoded_endpoint_header
// strategy.
type EncodedEndpointHeaderConfig struct {
	Header string `json:"header"`
}

// SessionIDConfig configures the session_id strategy.
type SessionIDConfig struct {
	Sources []struct {
		Header    string `json:"header"`
		Attribute string `json:"attribute"`
	} `json:"sources"`
	EvictionTTLSeconds   *float64 `json:"evictionTtlSeconds"`
	EvictionSweepSeconds *float64 `json:"evictionSweepSeconds"`
}

// Scorer implements session-affinity-scorer.
type Scorer struct {
	scheduling.Named
	profile  string
	headers  []string
	ttl      time.Duration
	sweepGap time.Duration
	now      func() time.Time
	// key holds the request's session (session_id) or the id of the
	// endpoint chosen (encoded_endpoint_header).
	key scheduling.Key[*string]
	// tokenHeader is the encoded_endpoint_header strategy's header; ""
	// for session_id.
	tokenHeader string

	// mu guards the bindings: session → element of byUse (front = most
	// recently used), at most MaxSessions.
	mu        sync.Mutex
	sessions  map[string]*list.Element
	byUse     *list.List
	lastSweep time.Time
}

type binding struct {
	session, address string
	used             time.Time
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	s := &Scorer{Named: scheduling.NewNamed(Type, name), profile: p.ProfileName, ttl: DefaultEvictionTTL, sweepGap: DefaultEvictionSweep,
		now: scheduling.NowOf(h), sessions: map[string]*list.Element{}, byUse: list.New()}
	s.key = scheduling.NewKey[*string](s.TypedName().String())
	switch p.Strategy {
	case StrategySessionID:
		if p.EncodedEndpointHeaderConfig != nil {
			return nil, fmt.Errorf("parameters.encodedEndpointHeaderConfig configures the %s strategy, not %s", StrategyEncodedHeader, StrategySessionID)
		}
	case "", StrategyEncodedHeader:
		if p.SessionIDConfig != nil {
			return nil, fmt.Errorf("parameters.sessionIdConfig configures the %s strategy, not %s (the default)", StrategySessionID, StrategyEncodedHeader)
		}
		s.tokenHeader = eppwire.HeaderSessionToken
		if c := p.EncodedEndpointHeaderConfig; c != nil && strings.TrimSpace(c.Header) != "" {
			s.tokenHeader = strings.ToLower(strings.TrimSpace(c.Header))
		}
		return s, nil
	default:
		return nil, fmt.Errorf("parameters.strategy: want %s or %s, got %q", StrategySessionID, StrategyEncodedHeader, p.Strategy)
	}
	if c := p.SessionIDConfig; c != nil {
		for i, src := range c.Sources {
			switch {
			case src.Attribute != "" && src.Header == "":
				return nil, &scheduling.UnsupportedParameterError{Param: fmt.Sprintf("sessionIdConfig.sources[%d].attribute", i), Reason: "no kvgate plugin publishes request attributes; read the session from a header"}
			case src.Header == "" || src.Attribute != "":
				return nil, fmt.Errorf("parameters.sessionIdConfig.sources[%d]: set exactly one of header and attribute", i)
			}
			s.headers = append(s.headers, strings.ToLower(src.Header))
		}
		for field, v := range map[string]*float64{"evictionTtlSeconds": c.EvictionTTLSeconds, "evictionSweepSeconds": c.EvictionSweepSeconds} {
			switch {
			case v == nil:
			case *v <= 0:
				return nil, fmt.Errorf("parameters.sessionIdConfig.%s must be positive, got %v", field, *v)
			case *v*float64(time.Second) >= math.MaxInt64:
				// As a duration it would wrap negative: every binding
				// expired at once.
				return nil, fmt.Errorf("parameters.sessionIdConfig.%s must be under %.0f seconds, got %v", field, float64(math.MaxInt64)/float64(time.Second), *v)
			}
		}
		if c.EvictionTTLSeconds != nil {
			s.ttl = time.Duration(*c.EvictionTTLSeconds * float64(time.Second))
		}
		if c.EvictionSweepSeconds != nil {
			s.sweepGap = time.Duration(*c.EvictionSweepSeconds * float64(time.Second))
		}
	}
	if len(s.headers) == 0 {
		s.headers = []string{DefaultSessionHeader}
	}
	return s, nil
}

// sessionOf is the request's session identifier; "" when it names none.
func (s *Scorer) sessionOf(req *scheduling.Request) string {
	for _, h := range s.headers {
		if v := strings.TrimSpace(req.Headers[h]); v != "" && len(v) <= maxSessionIDBytes {
			return v
		}
	}
	return ""
}

// EndpointID is the id an encoded_endpoint_header token names: llm-d's
// "<namespace>/<name>" when discovery knows the endpoint's namespace, else
// its name.
func EndpointID(e *endpoints.Endpoint) string {
	if ns := e.Label(namespaceLabel); ns != "" {
		return ns + "/" + e.Name()
	}
	return e.Name()
}

// namespaceLabel is the endpoint label discovery keeps a pod's namespace in.
const namespaceLabel = "namespace"

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	if s.tokenHeader != "" {
		s.scoreToken(req, eps, scores)
		return
	}
	session := s.sessionOf(req)
	if session == "" {
		return
	}
	scheduling.Write(cs, s.key, &session)
	addr, ok := s.bound(session)
	if !ok {
		return
	}
	for i, e := range eps {
		if e.Address() == addr {
			scores[i] = 1
		}
	}
}

// scoreToken scores 1 the endpoint the request's token names.
func (s *Scorer) scoreToken(req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	tok := strings.TrimSpace(req.Headers[s.tokenHeader])
	if tok == "" || len(tok) > 2*maxSessionIDBytes {
		return
	}
	id, err := base64.StdEncoding.DecodeString(tok)
	if err != nil {
		return // a token not of this picker: no preference
	}
	for i, e := range eps {
		if EndpointID(e) == string(id) {
			scores[i] = 1
		}
	}
}

// ResponseHeader implements scheduling.ResponseHeader: with
// encoded_endpoint_header, the token of the endpoint chosen goes back to
// the client.
func (s *Scorer) ResponseHeader(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.ResponseHead) {
	if s.tokenHeader == "" {
		return
	}
	if id, ok := scheduling.Read(cs, s.key); ok {
		res.Set(s.tokenHeader, base64.StdEncoding.EncodeToString([]byte(*id)))
	}
}

// bound is the session's endpoint, if its binding is alive.
func (s *Scorer) bound(session string) (string, bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	el, ok := s.sessions[session]
	if !ok {
		return "", false
	}
	b := el.Value.(*binding)
	if now.Sub(b.used) > s.ttl {
		s.drop(el)
		return "", false
	}
	return b.address, true
}

// PreRequest implements scheduling.PreRequest: the session is bound to
// where this request goes (the configured profile's target, else the
// primary's).
func (s *Scorer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	if res == nil {
		return
	}
	pr := res.Primary()
	if s.profile != defaultProfileMeansAny {
		pr = res.Profiles[s.profile]
	}
	if pr == nil || len(pr.Targets) == 0 {
		return
	}
	if s.tokenHeader != "" {
		id := EndpointID(pr.Targets[0])
		scheduling.Write(cs, s.key, &id)
		return
	}
	session, ok := scheduling.Read(cs, s.key)
	if !ok {
		return
	}
	s.bind(*session, pr.Targets[0].Address(), s.now())
}

func (s *Scorer) bind(session, addr string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.sessions[session]; ok {
		b := el.Value.(*binding)
		b.address, b.used = addr, now
		s.byUse.MoveToFront(el)
		return
	}
	if len(s.sessions) >= MaxSessions {
		s.drop(s.byUse.Back())
	}
	s.sessions[session] = s.byUse.PushFront(&binding{session: session, address: addr, used: now})
}

// sweep drops expired bindings, at most once per sweep gap. byUse is in
// order of use, so the expired ones are at its back.
func (s *Scorer) sweep(now time.Time) {
	if now.Sub(s.lastSweep) < s.sweepGap {
		return
	}
	s.lastSweep = now
	for el := s.byUse.Back(); el != nil && now.Sub(el.Value.(*binding).used) > s.ttl; el = s.byUse.Back() {
		s.drop(el)
	}
}

func (s *Scorer) drop(el *list.Element) {
	delete(s.sessions, el.Value.(*binding).session)
	s.byUse.Remove(el)
}

// EndpointsRemoved implements scheduling.EndpointsRemoved: sessions bound
// to a leaving endpoint are dropped (they rebind on their next request).
func (s *Scorer) EndpointsRemoved(addresses []string) {
	gone := map[string]bool{}
	for _, a := range addresses {
		gone[a] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for el := s.byUse.Front(); el != nil; {
		next := el.Next()
		if gone[el.Value.(*binding).address] {
			s.drop(el)
		}
		el = next
	}
}

// Sessions is the number of bindings held.
func (s *Scorer) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

var (
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
	_ scheduling.ResponseHeader   = (*Scorer)(nil)
)
