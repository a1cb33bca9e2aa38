package endpoints

import (
	"sync"
	"sync/atomic"
	"time"
)

// The live load model. Scraped metrics are tens of milliseconds old and
// blind to a prefill in progress, so every decision made between two scrapes
// sees the same snapshot: under a burst they all herd onto the endpoint that
// looked idle. The picker therefore keeps its own account of what it routed,
// updated at the decision and on the response stream:
//
//   - prefill backlog: requests routed here that have not produced a first
//     token, and the uncached prompt tokens the server must compute for them
//     (the part its prefix cache does not hold);
//   - decode load: sequences past their first token, with their context
//     tokens, until the response ends for any reason;
//   - the traffic class of every request in flight (sheddable: priority
//     < 0, llm-d's meaning), so that placement and admission by class read
//     the same lifecycle (fallbacks included) as every other count here.
//
// A P/D request's prefill is charged to its prefill server until the decode
// server's first token, also while its KV is on the wire and the server is
// free of it; the charge can carry the predicted end of its compute
// (ChargeComputedBy), and PrefillBacklog leaves it out from then on.
//
// Scrapes and the account overlap: a scrape counts the requests the server
// had admitted when it was taken, many of which the picker routed. At each
// scrape the picker's own count at that instant is subtracted from the
// server's, and only the excess (traffic the picker did not route: another
// picker replica, direct clients) is added to the live account, so nothing
// is counted twice.

// Load is a consistent-enough view of an endpoint's live load: each field is
// read atomically, the set is not (a decision racing a response may see one
// request in both phases or neither, which is harmless for scoring).
type Load struct {
	// PrefillRequests and PrefillTokens are the routed requests awaiting
	// their first token and their uncached prompt tokens.
	PrefillRequests int64
	PrefillTokens   int64
	// PrefillAttention is those requests' causal attention pairs (for n
	// uncached tokens after c cached ones, n·c + n(n+1)/2): long prompts
	// cost quadratically, which token counts alone cannot show.
	PrefillAttention int64
	// DecodeRequests and DecodeTokens are the routed requests producing
	// output and their context tokens (prompt plus expected output).
	DecodeRequests int64
	DecodeTokens   int64
	// ExternalWaiting and ExternalRunning are the server's queued and
	// running requests that the picker did not route, as of the last scrape.
	ExternalWaiting int64
	ExternalRunning int64
}

// Requests is every request the model believes the server holds.
func (l Load) Requests() int64 {
	return l.PrefillRequests + l.DecodeRequests + l.ExternalWaiting + l.ExternalRunning
}

// liveLoad is the account behind Load; its fields change concurrently.
type liveLoad struct {
	prefillRequests  atomic.Int64
	prefillTokens    atomic.Int64
	prefillAttention atomic.Int64
	decodeRequests   atomic.Int64
	decodeTokens     atomic.Int64
	externalWaiting  atomic.Int64
	externalRunning  atomic.Int64
	// sheddableRequests is the part of the endpoint's in-flight requests
	// charged as sheddable; the rest are protected.
	sheddableRequests atomic.Int64
}

// computedSet is an endpoint's charges with a predicted finish
// (ChargeComputedBy) while they are in the prefill phase. Its lock orders
// their changes to the prefill counters with PrefillBacklog's reads, so
// that a reader sees such a charge in the counters and in the set both or
// in neither. One entry per routed request: the picker's bound on requests
// in flight bounds it.
type computedSet struct {
	mu  sync.Mutex
	set map[*computedBy]struct{}
}

// rareState is what few endpoints need, made at the first need: the
// charges with a predicted finish, and the endpoint that replaced this one
// at its address (replaceBy; nil while this one is a member). One pointer
// for both keeps Endpoint within its 256 bytes.
type rareState struct {
	computed  computedSet
	successor atomic.Pointer[Endpoint]
}

// computedBy is a charged prefill that a prediction says its server has
// computed by at: a P/D request's, which the picker charges to its prefill
// server until the decode server's first token, while from at on its KV is
// on the wire and the server is free of it.
type computedBy struct {
	at                time.Time
	tokens, attention int64
}

// Load returns the endpoint's live load.
func (e *Endpoint) Load() Load {
	l := &e.load
	return Load{
		PrefillRequests:  l.prefillRequests.Load(),
		PrefillTokens:    l.prefillTokens.Load(),
		PrefillAttention: l.prefillAttention.Load(),
		DecodeRequests:   l.decodeRequests.Load(),
		DecodeTokens:     l.decodeTokens.Load(),
		ExternalWaiting:  l.externalWaiting.Load(),
		ExternalRunning:  l.externalRunning.Load(),
	}
}

// reconcile takes a new scrape into the account: the server's counts beyond
// the picker's own are traffic from elsewhere. The picker's decoding
// requests are among the server's running ones; its prefill-phase requests
// may be waiting or running (a chunked prefill runs), so where the excess
// stands is unknown: it is split in proportion to the server's waiting and
// the running requests that are not the picker's decodes.
func (l *liveLoad) reconcile(m *Metrics) {
	ownPrefill := l.prefillRequests.Load()
	ownDecode := l.decodeRequests.Load()
	waiting, running := int64(max(0, m.WaitingQueueSize)), int64(max(0, m.RunningRequests))
	excess := max(0, waiting+running-ownPrefill-ownDecode)
	var extWaiting int64
	if pool := waiting + max(0, running-ownDecode); pool > 0 {
		extWaiting = excess * waiting / pool
	}
	l.externalWaiting.Store(extWaiting)
	l.externalRunning.Store(excess - extWaiting)
}

// Charge is one routed request's share of an endpoint's live load, from the
// decision to the end of its response. It is owned by the request's
// exchange (one goroutine); the zero Charge charges nothing.
type Charge struct {
	ep *Endpoint
	// prefillTokens is what the first token releases; contextTokens what
	// the decode phase holds; tokens what the in-flight token count holds.
	prefillTokens, attention, contextTokens, tokens int64
	phase                                           chargePhase
	// sheddable is the request's class; remote marks a P/D prefill for
	// another server's decode.
	sheddable, remote bool
	// computed is the prefill's predicted finish (nil: none predicted).
	computed *computedBy
}

type chargePhase uint8

const (
	phaseNone chargePhase = iota
	phasePrefill
	phaseDecode
)

// maxChargedTokens bounds the token counts a charge holds: a prompt's length
// comes from the client (or its estimate from the body's size), and the
// attention pairs grow with its square; 16M tokens is far beyond any model's
// context and keeps every sum far from overflowing.
const maxChargedTokens = 1 << 24

func boundTokens(n int64) int64 { return min(max(0, n), maxChargedTokens) }

// AttentionPairs is the causal attention work of computing uncached tokens
// after cached ones (each counted up to maxChargedTokens).
func AttentionPairs(cached, uncached int64) int64 {
	cached, uncached = boundTokens(cached), boundTokens(uncached)
	return uncached*cached + uncached*(uncached+1)/2
}

// Charge records a protected request routed to e: the prompt tokens the
// server must compute before its first token (uncached, after cached ones in
// its prefix cache), the context it will hold while decoding, and the token
// estimate the in-flight counters carry.
func (e *Endpoint) Charge(cached, uncached, context, tokens int64) Charge {
	return e.ChargeClass(false, cached, uncached, context, tokens)
}

// ChargeClass is Charge for a request of either traffic class: a sheddable
// one is also counted in InflightByClass's sheddable part.
func (e *Endpoint) ChargeClass(sheddable bool, cached, uncached, context, tokens int64) Charge {
	return e.charge(sheddable, false, cached, uncached, context, tokens, time.Time{})
}

// ChargeComputedBy charges a P/D request's remote prefill: e computes the
// prompt for another server's decode, and the charge holds until that
// server's first token. It is predicted computed by at (zero: not
// predicted); from then on PrefillBacklog leaves it out. It counts in
// InflightRequests and InflightTokens (e serves it) but not in
// DecodingInflight (e never decodes it).
func (e *Endpoint) ChargeComputedBy(sheddable bool, cached, uncached, context, tokens int64, at time.Time) Charge {
	return e.charge(sheddable, true, cached, uncached, context, tokens, at)
}

func (e *Endpoint) charge(sheddable, remote bool, cached, uncached, context, tokens int64, at time.Time) Charge {
	uncached = boundTokens(uncached)
	c := Charge{ep: e, prefillTokens: uncached, attention: AttentionPairs(cached, uncached), contextTokens: boundTokens(context), tokens: tokens, phase: phasePrefill, sheddable: sheddable, remote: remote}
	if !at.IsZero() {
		c.computed = &computedBy{at: at, tokens: c.prefillTokens, attention: c.attention}
	}
	c.apply(1)
	return c
}

// rareState is e's, made at its first charge with a predicted finish or
// at its replacement.
func (e *Endpoint) rareState() *rareState {
	if r := e.rare.Load(); r != nil {
		return r
	}
	e.rare.CompareAndSwap(nil, &rareState{computed: computedSet{set: map[*computedBy]struct{}{}}})
	return e.rare.Load()
}

// PrefillBacklog is the prefill tokens and attention pairs charged to e
// (Load's PrefillTokens and PrefillAttention) less those of the charges
// predicted computed by now.
func (e *Endpoint) PrefillBacklog(now time.Time) (tokens, attention int64) {
	l := &e.load
	// The counters are read before the set is looked for: a charge with a
	// predicted finish makes the set before it adds to them, so while
	// there is none they hold no such charge. (Read after, they could
	// hold the first one, charged in between, without its set entry.)
	tokens, attention = l.prefillTokens.Load(), l.prefillAttention.Load()
	r := e.rare.Load()
	if r == nil {
		return tokens, attention
	}
	cs := &r.computed
	cs.mu.Lock()
	defer cs.mu.Unlock()
	tokens, attention = l.prefillTokens.Load(), l.prefillAttention.Load()
	for x := range cs.set {
		if !now.Before(x.at) {
			tokens -= x.tokens
			attention -= x.attention
		}
	}
	return max(0, tokens), max(0, attention)
}

// Endpoint is the endpoint charged (the one that replaced it, once it was
// replaced); nil for the zero Charge.
func (c *Charge) Endpoint() *Endpoint {
	if c.ep == nil {
		return nil
	}
	return c.ep.current()
}

// FirstToken moves the request from the prefill backlog to the decode load.
// Later calls do nothing.
func (c *Charge) FirstToken() {
	if c.phase != phasePrefill {
		return
	}
	c.apply(-1)
	c.phase = phaseDecode
	c.apply(1)
}

// Move re-charges the request to another endpoint in the same phase: the
// proxy served it from a fallback.
func (c *Charge) Move(to *Endpoint) {
	if c.phase == phaseNone || to == nil || to.current() == c.ep.current() {
		return
	}
	c.apply(-1)
	c.ep = to
	c.apply(1)
}

// Release ends the charge: the response finished, failed or was abandoned.
// Later calls do nothing.
func (c *Charge) Release() {
	if c.phase == phaseNone {
		return
	}
	c.apply(-1)
	c.phase = phaseNone
}

// apply adds the charge (sign 1) or takes it away (-1) at its endpoint's
// current successor, then forwards whatever a replacement racing it left
// on the endpoint it resolved.
func (c *Charge) apply(sign int64) {
	c.ep = c.ep.current()
	c.applyAt(sign)
	c.ep.forward()
}

func (c *Charge) applyAt(sign int64) {
	l := &c.ep.load
	switch c.phase {
	case phasePrefill:
		if x := c.computed; x != nil {
			cs := &c.ep.rareState().computed
			cs.mu.Lock()
			defer cs.mu.Unlock()
			if sign > 0 {
				cs.set[x] = struct{}{}
			} else {
				delete(cs.set, x)
			}
		}
		l.prefillRequests.Add(sign)
		l.prefillTokens.Add(sign * c.prefillTokens)
		l.prefillAttention.Add(sign * c.attention)
	case phaseDecode:
		l.decodeRequests.Add(sign)
		l.decodeTokens.Add(sign * c.contextTokens)
	default:
		return
	}
	c.ep.inflightRequests.Add(sign)
	c.ep.inflightTokens.Add(sign * c.tokens)
	if c.remote {
		c.ep.remoteRequests.Add(sign)
		c.ep.remoteTokens.Add(sign * c.tokens)
	}
	if c.sheddable {
		l.sheddableRequests.Add(sign)
	}
}

// Loads is one request's snapshot of every candidate's live load, taken
// once so that every plugin of the request sees the same numbers.
type Loads struct {
	Candidates []*Endpoint
	Loads      []Load
}

// Replacement. When an endpoint's Spec changes (a relabelled pod), the
// datastore builds a fresh Endpoint for it, but the server at that address
// still holds every request the picker charged to the old one, and their
// charges end later, on the old pointer. So the old endpoint is linked to
// its successor: its live account moves there, and each charge resolves
// its endpoint through the links at every change, so it is added to and
// taken from the endpoint that holds it. Charges and the move run
// concurrently without a common lock: a charge that resolved the old
// endpoint just before the link was set applies there, and then, seeing
// the link (every access is sequentially consistent), forwards its change
// itself; if it applied before the mover's forward, that forward took it.
// Either way nothing stays behind.

// replaceBy makes n e's successor and moves e's live load to n, with the
// step clock (the same server's engine steps). The datastore calls it once
// per endpoint, for one that leaves with a fresh endpoint at its address.
func (e *Endpoint) replaceBy(n *Endpoint) {
	n.steps.last.Store(e.steps.last.Load())
	n.steps.gap.Store(e.steps.gap.Load())
	n.steps.count.Store(e.steps.count.Load())
	e.rareState().successor.Store(n)
	e.forward()
}

// successor is the endpoint that replaced e; nil while e is a member.
func (e *Endpoint) successor() *Endpoint {
	if r := e.rare.Load(); r != nil {
		return r.successor.Load()
	}
	return nil
}

// current is the member that e is, or that replaced it.
func (e *Endpoint) current() *Endpoint {
	for n := e.successor(); n != nil; n = e.successor() {
		e = n
	}
	return e
}

// forward moves what charges hold on e, and on each replaced endpoint
// after it, along the successor links.
func (e *Endpoint) forward() {
	for n := e.successor(); n != nil; e, n = n, n.successor() {
		e.handOver(n)
	}
}

// handOver moves e's charged counts and predicted finishes to n. It holds
// e's set lock, which every change of a charge with a predicted finish
// takes, and, when there are such charges to move, n's too (e's first:
// links only go forward, so two hand-overs never take them in opposite
// orders), so that PrefillBacklog sees each of them in n's counters and
// set together. n gets a set only then, and so keeps the lock-free
// PrefillBacklog of an endpoint without such charges.
func (e *Endpoint) handOver(n *Endpoint) {
	cs := &e.rareState().computed
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.set) > 0 {
		dst := &n.rareState().computed
		dst.mu.Lock()
		defer dst.mu.Unlock()
		for x := range cs.set {
			dst.set[x] = struct{}{}
		}
		clear(cs.set)
	}
	from, to := &e.load, &n.load
	for _, p := range [...][2]*atomic.Int64{
		{&from.prefillRequests, &to.prefillRequests},
		{&from.prefillTokens, &to.prefillTokens},
		{&from.prefillAttention, &to.prefillAttention},
		{&from.decodeRequests, &to.decodeRequests},
		{&from.decodeTokens, &to.decodeTokens},
		{&from.sheddableRequests, &to.sheddableRequests},
		{&e.inflightRequests, &n.inflightRequests},
		{&e.inflightTokens, &n.inflightTokens},
		{&e.remoteRequests, &n.remoteRequests},
		{&e.remoteTokens, &n.remoteTokens},
	} {
		if v := p[0].Swap(0); v != 0 {
			p[1].Add(v)
		}
	}
}
