package endpoints

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Source discovers the pool's membership. Run calls apply with the complete
// set each time it changes (never a delta) until ctx is done; apply returns
// the datastore's verdict so that a source can report a rejected set. Run
// returns nil when ctx is cancelled, or an error when discovery cannot start.
// The static file (package staticfile) and Kubernetes are implementations.
type Source interface {
	Run(ctx context.Context, apply func([]Spec) error) error
}

// Change is one membership transition. An endpoint whose Spec changed
// appears as the old value in Removed and the new one in Added.
type Change struct {
	Added   []*Endpoint
	Removed []*Endpoint
}

// Listener is told about membership changes: scrapers start and stop, the
// KV-event index forgets a removed endpoint's blocks.
type Listener interface {
	// EndpointsChanged is called once per change, in the order the changes
	// were applied, never concurrently with itself, and without the state
	// lock held, so it may read the datastore and health updates proceed.
	// Writers of membership wait for it (that is what keeps the order): it
	// must not call Replace, Subscribe or an unsubscribe function, and
	// should return quickly.
	EndpointsChanged(c Change)
}

// ListenerFunc adapts a function to Listener.
type ListenerFunc func(Change)

// EndpointsChanged calls f.
func (f ListenerFunc) EndpointsChanged(c Change) { f(c) }

// snapshot is one immutable membership view; readers load it atomically.
type snapshot struct {
	all        []*Endpoint // sorted by name
	candidates []*Endpoint // healthy subset of all, same order
	byName     map[string]*Endpoint
	byAddr     map[addrKey]*Endpoint
	unhealthy  map[*Endpoint]struct{} // subset of all
}

// Datastore holds the pool's endpoints.
//
// Concurrency: reads (Candidates, All, Get, ByAddress) are a single atomic
// load and never block. Writers (Replace, SetHealthy) serialise on mu and
// publish a new snapshot. notifyMu orders listener calls: a writer that
// changes membership takes it before mu and keeps it until every listener
// has returned, so listeners see changes one at a time and in order.
type Datastore struct {
	cfg Config

	notifyMu  sync.Mutex
	listeners []*listenerEntry // guarded by notifyMu

	mu    sync.Mutex
	state atomic.Pointer[snapshot]
}

type listenerEntry struct{ l Listener }

// DefaultMaxEndpoints bounds a pool: every decision scores every
// candidate and each endpoint costs a scrape loop, so a runaway set (a
// 10,000-line file) would starve the picker rather than serve.
const DefaultMaxEndpoints = 2048

// ErrTooManyEndpoints rejects a membership set larger than the cap.
var ErrTooManyEndpoints = errors.New("too many endpoints")

// Config tunes a Datastore; the zero value takes the defaults.
type Config struct {
	// MaxEndpoints caps the pool (default DefaultMaxEndpoints); a larger
	// set is rejected whole and the previous one stays.
	MaxEndpoints int
	// AwaitFirstScrape keeps new endpoints out of the candidate set until
	// their scraper reports them healthy (SetHealthy): a server that never
	// answered its /metrics is not routed to. Only for a datastore whose
	// endpoints are scraped; a Hostname endpoint (a peer cluster, which
	// the scraper skips) is a candidate at once.
	AwaitFirstScrape bool
}

// NewDatastore returns an empty datastore with the default Config.
func NewDatastore() *Datastore { return NewDatastoreWith(Config{}) }

// NewDatastoreWith returns an empty datastore configured by cfg.
func NewDatastoreWith(cfg Config) *Datastore {
	if cfg.MaxEndpoints <= 0 {
		cfg.MaxEndpoints = DefaultMaxEndpoints
	}
	d := &Datastore{cfg: cfg}
	d.state.Store(&snapshot{})
	return d
}

// Candidates returns the healthy endpoints, sorted by name. The slice is
// shared: callers must not modify it (its capacity is clipped, so append
// copies).
func (d *Datastore) Candidates() []*Endpoint { return d.state.Load().candidates }

// All returns every endpoint, healthy or not, sorted by name; shared like
// Candidates.
func (d *Datastore) All() []*Endpoint { return d.state.Load().all }

// Get returns the endpoint with that name, or nil.
func (d *Datastore) Get(name string) *Endpoint { return d.state.Load().byName[name] }

// ByAddress returns the endpoint at ip:port, or nil. Any spelling of the
// address finds it: an IPv6 address in upper or lower case, zero-compressed
// or not, or IPv4-mapped ("[::ffff:10.0.0.1]:8000" is 10.0.0.1:8000), as
// Envoy's served-endpoint metadata, Kubernetes and an endpoints file may
// each write it; a Hostname endpoint's host:port in any case.
func (d *Datastore) ByAddress(addr string) *Endpoint { return d.state.Load().byAddr[keyOf(addr)] }

// addrKey indexes an endpoint by address: a literal ip:port as netip reads
// it, with an IPv4-mapped address unmapped, so that every spelling of one
// address has one key; any other address (a Hostname endpoint's DNS
// host:port) by its lower-case text, DNS names being case-insensitive.
type addrKey struct {
	ip   netip.AddrPort
	host string
}

func keyOf(addr string) addrKey {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return addrKey{ip: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
	}
	return addrKey{host: strings.ToLower(addr)}
}

// Healthy reports whether e is a current member that is a candidate.
func (d *Datastore) Healthy(e *Endpoint) bool {
	s := d.state.Load()
	if s.byName[e.Name()] != e {
		return false
	}
	_, bad := s.unhealthy[e]
	return !bad
}

// Replace makes specs the complete membership. An endpoint whose Spec is
// unchanged keeps its *Endpoint, so its metrics, in-flight counters and
// health survive; new or changed specs get fresh endpoints, which start
// healthy (or, with AwaitFirstScrape, once scraped). A fresh endpoint at
// the address of one that leaves (its labels or another attribute
// changed) is the same server: it takes over the live load the picker
// charged to the one it replaces, and the charges follow it (see
// Endpoint.replaceBy). An invalid set (see Validate) or one over
// MaxEndpoints is rejected whole and nothing changes.
func (d *Datastore) Replace(specs []Spec) error {
	if len(specs) > d.cfg.MaxEndpoints {
		return fmt.Errorf("%w: %d, at most %d per pool (--max-endpoints)", ErrTooManyEndpoints, len(specs), d.cfg.MaxEndpoints)
	}
	if err := Validate(specs); err != nil {
		return err
	}
	d.notifyMu.Lock()
	defer d.notifyMu.Unlock()

	d.mu.Lock()
	old := d.state.Load()
	next := &snapshot{
		all:       make([]*Endpoint, 0, len(specs)),
		byName:    make(map[string]*Endpoint, len(specs)),
		byAddr:    make(map[addrKey]*Endpoint, len(specs)),
		unhealthy: map[*Endpoint]struct{}{},
	}
	var c Change
	for _, s := range specs {
		e := old.byName[s.Name]
		if e == nil || !SpecEqual(e.spec, s) {
			e = NewEndpoint(cloneSpec(s))
			c.Added = append(c.Added, e)
			if d.cfg.AwaitFirstScrape && !s.Hostname { // a peer cluster is not scraped
				next.unhealthy[e] = struct{}{}
			}
		} else if _, bad := old.unhealthy[e]; bad {
			next.unhealthy[e] = struct{}{}
		}
		next.all = append(next.all, e)
		next.byName[s.Name] = e
		next.byAddr[keyOf(s.Address)] = e
	}
	for _, e := range old.all {
		if next.byName[e.Name()] != e {
			c.Removed = append(c.Removed, e)
			// Addresses are unique in a set, so a successor at e's
			// address is a fresh endpoint, never a kept one.
			if n := next.byAddr[keyOf(e.Address())]; n != nil {
				e.replaceBy(n)
			}
		}
	}
	slices.SortFunc(next.all, byName)
	next.candidates = healthySubset(next.all, next.unhealthy)
	d.state.Store(next)
	d.mu.Unlock()

	if len(c.Added)+len(c.Removed) == 0 {
		return nil
	}
	slices.SortFunc(c.Added, byName)
	slices.SortFunc(c.Removed, byName)
	for _, le := range d.listeners {
		le.l.EndpointsChanged(c)
	}
	return nil
}

// SetHealthy moves e in or out of the candidate set; the endpoint's scraper
// calls it. It is a no-op for an endpoint that is no longer a member, so a
// scraper racing with its endpoint's removal cannot resurrect it.
func (d *Datastore) SetHealthy(e *Endpoint, healthy bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.state.Load()
	if old.byName[e.Name()] != e {
		return
	}
	if _, bad := old.unhealthy[e]; bad == !healthy {
		return
	}
	next := *old
	next.unhealthy = maps.Clone(old.unhealthy)
	if healthy {
		delete(next.unhealthy, e)
	} else {
		next.unhealthy[e] = struct{}{}
	}
	next.candidates = healthySubset(next.all, next.unhealthy)
	d.state.Store(&next)
}

// Subscribe registers l and immediately tells it the current membership as
// one Change with everything Added, so a late subscriber misses nothing.
// The returned function unsubscribes; after it returns, l is not called
// again.
func (d *Datastore) Subscribe(l Listener) (unsubscribe func()) {
	d.notifyMu.Lock()
	defer d.notifyMu.Unlock()
	le := &listenerEntry{l: l}
	d.listeners = append(d.listeners, le)
	if all := d.All(); len(all) > 0 {
		l.EndpointsChanged(Change{Added: slices.Clone(all)})
	}
	return func() {
		d.notifyMu.Lock()
		defer d.notifyMu.Unlock()
		d.listeners = slices.DeleteFunc(d.listeners, func(x *listenerEntry) bool { return x == le })
	}
}

// Run feeds the datastore from src until ctx is done.
func (d *Datastore) Run(ctx context.Context, src Source) error {
	return src.Run(ctx, d.Replace)
}

func healthySubset(all []*Endpoint, unhealthy map[*Endpoint]struct{}) []*Endpoint {
	if len(unhealthy) == 0 {
		return all[:len(all):len(all)]
	}
	out := make([]*Endpoint, 0, len(all)-len(unhealthy))
	for _, e := range all {
		if _, bad := unhealthy[e]; !bad {
			out = append(out, e)
		}
	}
	return out[:len(out):len(out)]
}

func byName(a, b *Endpoint) int { return strings.Compare(a.Name(), b.Name()) }

// SpecEqual reports whether two specs describe the same endpoint in every
// field: a change of any makes a new Endpoint.
func SpecEqual(a, b Spec) bool {
	return a.Name == b.Name && a.Address == b.Address && a.MetricsURL == b.MetricsURL &&
		a.KVEvents == b.KVEvents && a.KVEventsReplay == b.KVEventsReplay && maps.Equal(a.Labels, b.Labels) &&
		a.NodeAddress == b.NodeAddress && a.Hostname == b.Hostname &&
		(a.DataParallel == nil) == (b.DataParallel == nil) && (a.DataParallel == nil || *a.DataParallel == *b.DataParallel)
}

// cloneSpec detaches the stored spec from the caller's label map and
// rank placement.
func cloneSpec(s Spec) Spec {
	s.Labels = maps.Clone(s.Labels)
	if s.DataParallel != nil {
		dp := *s.DataParallel
		s.DataParallel = &dp
	}
	return s
}
