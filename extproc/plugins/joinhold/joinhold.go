package joinhold

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// Type is the registered plugin type.
const Type = "prefill-join-hold"

// Defaults of the parameters.
const (
	DefaultMinTokens = 512
	DefaultMaxHold   = 10 * time.Second
)

// maxLine bounds one endpoint's line.
const maxLine = 4096

// Params are the plugin's parameters.
type Params struct {
	MinTokens int            `json:"minTokens"`
	MaxHold   duration.Nanos `json:"maxHold"`
}

// Plugin implements prefill-join-hold.
type Plugin struct {
	scheduling.Named
	params Params
	key    scheduling.Key[*ticket]
	// tickets recycles the per-request tickets (scheduling.Recycler), so
	// that a decision allocates nothing.
	tickets sync.Pool

	// spare recycles the lines of endpoints with nobody in prefill.
	spare sync.Pool

	mu sync.Mutex
	// lines holds only lines with requests in them: a line goes with its
	// last request. So an endpoint's line that a decision racing its
	// removal recreates (after EndpointsRemoved deleted it) lasts no
	// longer than that request, and the map is bounded by the requests in
	// flight rather than growing with every endpoint that ever left.
	lines map[string]*line
}

// line is one endpoint's requests in prefill, in routing order.
type line struct{ q []*ticket }

// ticket is one request's place in its endpoint's line. The plugin's
// mutex guards its fields once it is in a line.
type ticket struct {
	owner *Plugin
	addr  string
	long  bool
	// inLine is whether the ticket is in its endpoint's line, released
	// whether the request may go; ready, made only for a request that is
	// held, is closed at its release.
	inLine, released bool
	ready            chan struct{}
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{MinTokens: DefaultMinTokens, MaxHold: duration.Nanos(DefaultMaxHold)}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, fmt.Errorf("%s %q: %w", Type, name, err)
	}
	if p.MinTokens < 1 {
		return nil, fmt.Errorf("%s %q: parameters.minTokens must be at least 1, got %d", Type, name, p.MinTokens)
	}
	if p.MaxHold <= 0 {
		return nil, fmt.Errorf("%s %q: parameters.maxHold must be positive, got %s", Type, name, time.Duration(p.MaxHold))
	}
	pl := &Plugin{
		Named:  scheduling.NewNamed(Type, name),
		params: p,
		key:    scheduling.NewKey[*ticket](Type + "/" + name),
		lines:  map[string]*line{},
	}
	pl.tickets.New = func() any { return &ticket{owner: pl} }
	pl.spare.New = func() any { return &line{} }
	return pl, nil
}

// MinTokens is the uncached prompt length from which a request is held.
func (p *Plugin) MinTokens() int { return p.params.MinTokens }

// PreRequest implements scheduling.PreRequest: a streaming request routed
// to one endpoint (not P/D) takes its place in that endpoint's line, and
// is let go at once if it is short or nothing it would join is in
// prefill there.
func (p *Plugin) PreRequest(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Result) {
	primary := res.Primary()
	if !req.Stream || res.Prefill != nil || primary == nil || len(primary.Targets) == 0 {
		return
	}
	t := p.tickets.Get().(*ticket)
	t.addr, t.long = primary.Targets[0].Address(), res.Uncached >= p.params.MinTokens
	scheduling.Write(cs, p.key, t)
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines[t.addr]
	if l == nil {
		l = p.spare.Get().(*line)
		p.lines[t.addr] = l
	}
	if len(l.q) >= maxLine {
		t.released = true // not tracked: neither held nor waited for
		return
	}
	t.inLine = true
	l.q = append(l.q, t)
	releaseIn(l)
}

// Hold implements scheduling.Holder.
func (p *Plugin) Hold(cs *scheduling.CycleState) (<-chan struct{}, time.Duration) {
	t, ok := scheduling.Read(cs, p.key)
	if !ok {
		return nil, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.released {
		return nil, 0
	}
	if t.ready == nil {
		t.ready = make(chan struct{})
	}
	return t.ready, time.Duration(p.params.MaxHold)
}

// FirstToken implements scheduling.FirstToken: the request leaves prefill.
func (p *Plugin) FirstToken(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Response) {
	if t, ok := scheduling.Read(cs, p.key); ok {
		p.leave(t)
	}
}

// ResponseComplete implements scheduling.ResponseComplete: a request that
// ended without a first token (refused upstream, failed, its client gone
// while held) leaves its line too.
func (p *Plugin) ResponseComplete(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Response) {
	if t, ok := scheduling.Read(cs, p.key); ok {
		p.leave(t)
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved: the held
// requests of a removed endpoint go (to fail or fall back there).
func (p *Plugin) EndpointsRemoved(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addrs {
		if l := p.lines[a]; l != nil {
			for _, t := range l.q {
				t.inLine = false
				release(t)
			}
			delete(p.lines, a)
		}
	}
}

// Recycle implements scheduling.Recycler: the request has ended (a
// driver that never reported its end still takes it out of its line).
func (t *ticket) Recycle() {
	p := t.owner
	p.leave(t)
	*t = ticket{owner: p}
	p.tickets.Put(t)
}

// leave takes t out of its line and lets go what that frees.
func (p *Plugin) leave(t *ticket) {
	p.mu.Lock()
	defer p.mu.Unlock()
	release(t)
	if !t.inLine {
		return
	}
	t.inLine = false
	l := p.lines[t.addr]
	if i := slices.Index(l.q, t); i >= 0 {
		l.q = slices.Delete(l.q, i, i+1)
	}
	if len(l.q) == 0 {
		delete(p.lines, t.addr)
		p.spare.Put(l)
		return
	}
	releaseIn(l)
}

// releaseIn lets go every short request, and the first held long one
// once none of the line's requests that went to the server is in prefill:
// a long prompt's first chunk then joins no step that finishes another
// prompt, whether that prompt was routed before it or, being short, went
// past it while it waited.
func releaseIn(l *line) {
	busy := false
	for _, t := range l.q {
		if !t.long {
			release(t)
		}
		busy = busy || t.released
	}
	if busy {
		return
	}
	for _, t := range l.q {
		if !t.released {
			release(t)
			return
		}
	}
}

// release lets t go; the plugin's mutex is held.
func release(t *ticket) {
	if t.released {
		return
	}
	t.released = true
	if t.ready != nil {
		close(t.ready)
	}
}

var (
	_ scheduling.PreRequest       = (*Plugin)(nil)
	_ scheduling.Holder           = (*Plugin)(nil)
	_ scheduling.FirstToken       = (*Plugin)(nil)
	_ scheduling.ResponseComplete = (*Plugin)(nil)
	_ scheduling.EndpointsRemoved = (*Plugin)(nil)
	_ scheduling.Recycler         = (*ticket)(nil)
)
