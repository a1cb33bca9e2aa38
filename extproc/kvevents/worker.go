package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"time"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/zmtp"
)

// item is one queued message, or an endpoint's removal.
type item struct {
	endpoint string
	seq      uint64
	payload  []byte
	peer     *peer // the connection it came on
	reserved int   // bytes to give back to peer.mem once handled
	remove   bool
}

// seqState is what a worker knows of one endpoint's stream.
type seqState struct {
	last uint64 // sequence number of the last batch applied
	sum  uint64 // hash of that batch's payload, to recognise it in a replay
	seen uint64 // the worker's tick when it was applied
	peer *peer  // the connection the stream comes on
}

// worker applies the events of the endpoints hashed to it. Its goroutine
// owns states and keys; nothing else touches them.
type worker struct {
	s            *Subscriber
	q            chan item
	states       map[string]*seqState
	maxEndpoints int
	tick         uint64           // messages handled, a clock for forgetOldest
	keys         [keyChunk]uint64 // routing-key buffer, see eachKeys
	// mem is the budget of the connection whose message is being
	// handled, which what decoding its batches (and those replayed for
	// it) allocates is charged to; nil for none.
	mem *connBudget
}

// keyChunk is how many routing keys a worker converts at a time: a fixed
// buffer rather than one as long as the longest event, which would add 8
// bytes per hash (8 per payload byte) to what decoding allocated, outside
// the intake memory budget, and keep it. The index takes each key on its
// own, so chunks apply as the whole would.
const keyChunk = 256

// eachKeys calls fn with the routing keys of hashes, keyChunk at a time,
// until fn fails.
func (w *worker) eachKeys(hashes []kvwire.Hash, fn func(keys []uint64) error) error {
	for len(hashes) > 0 {
		n := min(len(hashes), keyChunk)
		if err := fn(kvwire.Keys(w.keys[:0], hashes[:n])); err != nil {
			return err
		}
		hashes = hashes[n:]
	}
	return nil
}

func (w *worker) run() {
	for {
		select {
		case <-w.s.ctx.Done():
			return
		case it := <-w.q:
			if it.remove {
				delete(w.states, it.endpoint)
				w.s.idx.ClearEndpoint(it.endpoint)
				continue
			}
			w.mem = it.peer.mem
			w.handle(it)
			w.mem = nil
			it.peer.mem.Release(it.reserved)
		}
	}
}

func (w *worker) sum(payload []byte) uint64 { return maphash.Bytes(w.s.seed, payload) }

// handle checks a message's place in its endpoint's stream, repairs what
// came before it when needed, then applies it.
//
// A stream is tied to the connection it comes on. Sequence numbers are
// only believed within that connection: a real publisher counts up by one
// on one connection, and only a new connection (a restart, a reconnect)
// can start a new count. So a message on another connection is ignored
// while the stream's connection is open (whoever sent it, it cannot
// clear the stream's entries), and once that connection has ended it
// starts a new stream: the replay socket, when configured (an address
// from the pool's configuration, not from the peer), tells a reconnect of
// the same publisher (its buffer still holds the last batch applied,
// byte for byte) from a restart (it does not), whatever the new sequence
// number claims. A restarted publisher's slow-joiner jump is therefore
// not mistaken for a gap of the old stream.
func (w *worker) handle(it item) {
	ep, seq := it.endpoint, it.seq
	st, known := w.states[ep]
	switch {
	case !known:
		// A reader that resolved ep just before EndpointRemoved (a central
		// topic, or a rank's batch rerouted from another rank's connection,
		// whose reader the removal does not wait for) queues it behind the
		// removal: its entries would never be removed. Only the pool's
		// endpoints start a stream; a removed one has no state, so this
		// check runs once per stream, not per message.
		if !w.s.configured(ep) {
			w.s.m.dropped.WithLabelValues(dropUnknownEndpoint).Inc()
			return
		}
		// Joining mid-stream is normal (slow joiner, picker restart); what
		// came before is unknown rather than wrong, so nothing is cleared.
		if len(w.states) >= w.maxEndpoints {
			w.forgetOldest()
		}
		st = &seqState{}
		w.states[ep] = st
	case it.peer != st.peer && !st.peer.closed.Load():
		w.s.m.dropped.WithLabelValues(dropConflictingStream).Inc()
		return
	case it.peer != st.peer:
		w.newStream(ep, st, seq, w.s.replayFor(it))
	case seq == st.last+1:
	case seq <= st.last:
		// No publisher counts backwards on one connection.
		w.s.m.dropped.WithLabelValues(dropSequenceRegression).Inc()
		w.s.log.Debug("kv events sequence went back on one connection; disconnecting", "endpoint", ep, "seq", seq, "last", st.last)
		_ = it.peer.conn.Close()
		return
	default:
		w.s.m.gaps.Inc()
		w.s.log.Debug("kv events gap", "endpoint", ep, "seq", seq, "last", st.last)
		replay := w.s.replayFor(it)
		if replay == "" {
			w.s.idx.ClearEndpoint(ep)
		} else {
			w.recover(ep, replay, st.last+1, seq)
		}
	}
	w.tick++
	st.last, st.sum, st.seen, st.peer = seq, w.sum(it.payload), w.tick, it.peer
	w.apply(ep, it.payload)
}

// newStream handles the first message of an endpoint's stream on a new
// connection, after the previous one ended.
func (w *worker) newStream(ep string, st *seqState, seq uint64, replay string) {
	switch {
	case seq <= st.last:
		// Numbering restarted: a new publisher, and a new (empty) cache.
		w.restarted(ep, seq, st.last)
		if seq > 0 && replay != "" {
			w.recover(ep, replay, 0, seq)
		}
	case replay != "":
		w.verify(ep, replay, st, seq)
	case seq == st.last+1:
		// A reconnect that lost nothing, or a restart that happens to
		// continue the count: without a replay socket to ask, the first
		// is far likelier.
	default:
		// Lost messages or a restart: either way what the index holds
		// may be stale.
		w.s.m.gaps.Inc()
		w.s.idx.ClearEndpoint(ep)
	}
}

func (w *worker) restarted(ep string, seq, last uint64) {
	w.s.m.restarts.Inc()
	w.s.log.Info("kv events publisher restarted", "endpoint", ep, "seq", seq, "last", last)
	w.s.idx.ClearEndpoint(ep)
}

// verify asks the replay socket for batches from the last one applied up
// to seq. If the first is that batch, byte for byte, the publisher is the
// one followed so far and the rest fills the gap. Otherwise it restarted:
// the endpoint is cleared and rebuilt from the new publisher's start.
func (w *worker) verify(ep, addr string, st *seqState, seq uint64) {
	ctx, cancel := context.WithTimeout(w.s.ctx, w.s.cfg.ReplayTimeout)
	defer cancel()
	next, checked, same := st.last, false, false
	err := replay(ctx, addr, st.last, w.s.dialConfig(zmtp.DEALER), func(rs uint64, payload []byte) bool {
		if rs >= seq {
			return false
		}
		if !checked {
			checked = true
			same = rs == st.last && w.sum(payload) == st.sum
			next = rs + 1
			return same
		}
		w.fill(ep, &next, rs, payload)
		return true
	})
	switch {
	case err != nil:
		w.s.m.replays.WithLabelValues(replayFailed).Inc()
		w.s.log.Debug("kv events replay failed", "endpoint", ep, "addr", addr, "err", err)
		w.s.idx.ClearEndpoint(ep)
	case !same:
		w.restarted(ep, seq, st.last)
		if seq > 0 {
			w.recover(ep, addr, 0, seq)
		}
	case next != seq:
		w.s.m.replays.WithLabelValues(replayPartial).Inc()
		w.s.idx.ClearEndpoint(ep)
	default:
		if seq > st.last+1 {
			w.s.m.gaps.Inc()
		}
		w.s.m.replays.WithLabelValues(replayOK).Inc()
	}
}

// forgetOldest drops the sequence state of the endpoint heard from least
// recently, bounding the states of endpoints that vanished without an
// EndpointRemoved (central socket, pod churn). Its next message, if any,
// counts as a first contact.
func (w *worker) forgetOldest() {
	oldest, oldestTick := "", uint64(0)
	for ep, st := range w.states {
		if oldest == "" || st.seen < oldestTick {
			oldest, oldestTick = ep, st.seen
		}
	}
	delete(w.states, oldest)
	// Without its sequence state nothing would notice the endpoint's
	// missed events, so its entries go too.
	w.s.idx.ClearEndpoint(oldest)
	w.s.m.forgotten.Inc()
}

// recover replays batches [from, to) from the endpoint's publisher. Where
// the publisher no longer holds a batch, the endpoint is cleared before the
// rest applies (later batches are still true, but what was lost may have
// removed blocks); when the exchange fails or stops short of to, it is
// cleared after.
func (w *worker) recover(ep, addr string, from, to uint64) {
	ctx, cancel := context.WithTimeout(w.s.ctx, w.s.cfg.ReplayTimeout)
	defer cancel()
	next, partial := from, false
	err := replay(ctx, addr, from, w.s.dialConfig(zmtp.DEALER), func(seq uint64, payload []byte) bool {
		if seq >= to {
			return false
		}
		partial = w.fill(ep, &next, seq, payload) || partial
		return true
	})
	switch {
	case err != nil:
		w.s.m.replays.WithLabelValues(replayFailed).Inc()
		w.s.log.Debug("kv events replay failed", "endpoint", ep, "addr", addr, "err", err)
		w.s.idx.ClearEndpoint(ep)
	case next != to:
		w.s.m.replays.WithLabelValues(replayPartial).Inc()
		w.s.idx.ClearEndpoint(ep)
	case partial:
		w.s.m.replays.WithLabelValues(replayPartial).Inc()
	default:
		w.s.m.replays.WithLabelValues(replayOK).Inc()
	}
}

// fill applies a replayed batch seq that continues the endpoint's stream
// at *next, skipping one already applied. Before a batch that follows a
// hole in what the publisher holds, the endpoint is cleared: events lost
// in the hole may have removed blocks that earlier batches stored. It
// reports whether there was a hole.
func (w *worker) fill(ep string, next *uint64, seq uint64, payload []byte) (hole bool) {
	if seq < *next {
		return false
	}
	if hole = seq > *next; hole {
		w.s.idx.ClearEndpoint(ep)
	}
	w.apply(ep, payload)
	*next = seq + 1
	return hole
}

// errBadReply is returned for a reply that does not follow the protocol.
var errBadReply = errors.New("kvevents: malformed replay reply")

// replay runs one exchange of vLLM's replay protocol as a DEALER: it sends
// ["", from] and hands each ["", seq, payload] reply to fn until the end
// marker, until fn returns false, or until ctx ends.
func replay(ctx context.Context, addr string, from uint64, cfg zmtp.DialConfig, fn func(seq uint64, payload []byte) bool) error {
	c, err := zmtp.Dial(ctx, addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if err := c.Send(time.Now().Add(cfg.HandshakeTimeout), []byte{}, binary.BigEndian.AppendUint64(nil, from)); err != nil {
		return err
	}
	for {
		msg, err := c.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			return errBadReply
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if seq == kvwire.ReplayEnd {
			return nil
		}
		if !fn(seq, msg.Frames[2]) {
			return nil
		}
	}
}

// apply decodes one batch and writes its events to the index. A batch that
// does not decode is lost like a gap, so the endpoint is cleared.
//
// What decoding keeps is charged to the connection's share of the intake
// memory budget until the batch is applied: a valid payload can decode to
// 16 times its size (1-byte hashes, each a 16-byte kvwire.Hash), which
// the bytes read alone would leave out of the budget. A batch the budget
// cannot hold is lost as one that does not decode.
func (w *worker) apply(ep string, payload []byte) {
	m := w.s.m
	opts := kvwire.DecodeOptions{SkipTokenIDs: true}
	charged := 0
	if mem := w.mem; mem != nil {
		opts.Reserve = func(n int) error {
			if err := mem.Reserve(n); err != nil {
				return err
			}
			charged += n
			return nil
		}
	}
	b, skipped, err := opts.Decode(payload)
	defer func() { w.mem.Release(charged) }()
	if err != nil {
		if errors.Is(err, errPublisherBudget) || errors.Is(err, errGlobalBudget) {
			m.dropped.WithLabelValues(dropMemory).Inc()
		} else {
			m.decodeErrors.Inc()
		}
		w.s.log.Debug("kv events decode failed", "endpoint", ep, "err", err)
		w.s.idx.ClearEndpoint(ep)
		return
	}
	m.batches.Inc()
	if skipped > 0 {
		m.events.WithLabelValues("unknown").Add(float64(skipped))
	}
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case kvwire.BlockStored:
			tier := kvindex.TierFromMedium(ev.Medium)
			if err := w.eachKeys(ev.BlockHashes, func(keys []uint64) error { return w.s.idx.Add(ep, tier, keys) }); err != nil {
				m.indexErrors.Inc()
				w.s.log.Debug("kv index refused events", "endpoint", ep, "err", err)
			}
		case kvwire.BlockRemoved:
			tier := kvindex.TierFromMedium(ev.Medium)
			_ = w.eachKeys(ev.BlockHashes, func(keys []uint64) error { w.s.idx.Remove(ep, tier, keys); return nil })
		case kvwire.AllBlocksCleared:
			// vLLM sends it when its block pool resets the prefix cache:
			// the GPU blocks. An offloading connector's tiers are reset
			// apart (reset_connector), so what they hold stays until
			// their own BlockRemoved events.
			w.s.idx.ClearTier(ep, kvindex.TierGPU)
		}
		m.events.WithLabelValues(ev.Type()).Inc()
	}
}
