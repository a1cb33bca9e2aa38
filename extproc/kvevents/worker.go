package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
)

// item is one queued message, or an endpoint's removal.
type item struct {
	endpoint string
	seq      uint64
	payload  []byte
	remove   bool
}

// seqState is what a worker knows of one endpoint's stream.
type seqState struct {
	last uint64 // sequence number of the last batch applied
	seen uint64 // the worker's tick when it was applied
}

// worker applies the events of the endpoints hashed to it. Its goroutine
// owns states and keys; nothing else touches them.
type worker struct {
	s            *Subscriber
	q            chan item
	states       map[string]*seqState
	maxEndpoints int
	tick         uint64   // messages handled, a clock for forgetOldest
	keys         []uint64 // reused routing-key buffer
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
			w.handle(it)
		}
	}
}

// handle checks a message's place in its endpoint's sequence, repairs what
// came before it when needed, then applies it.
func (w *worker) handle(it item) {
	ep, seq := it.endpoint, it.seq
	st, known := w.states[ep]
	switch {
	case !known:
		// Joining mid-stream is normal (slow joiner, picker restart); what
		// came before is unknown rather than wrong, so nothing is cleared.
		if len(w.states) >= w.maxEndpoints {
			w.forgetOldest()
		}
		st = &seqState{}
		w.states[ep] = st
	case seq == st.last+1:
	case seq <= st.last:
		// Numbering restarted: a new publisher, and a new (empty) cache.
		w.s.m.restarts.Inc()
		w.s.log.Info("kv events publisher restarted", "endpoint", ep, "seq", seq, "last", st.last)
		w.s.idx.ClearEndpoint(ep)
		if seq > 0 {
			if replay := w.s.replayOf(ep); replay != "" {
				w.recover(ep, replay, 0, seq)
			}
		}
	default:
		w.s.m.gaps.Inc()
		w.s.log.Debug("kv events gap", "endpoint", ep, "seq", seq, "last", st.last)
		replay := w.s.replayOf(ep)
		if replay == "" {
			w.s.idx.ClearEndpoint(ep)
		} else {
			w.recover(ep, replay, st.last+1, seq)
		}
	}
	w.tick++
	st.last, st.seen = seq, w.tick
	w.apply(ep, it.payload)
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

// recover replays batches [from, to) from the endpoint's publisher. When
// the publisher no longer holds batch from, the endpoint is cleared before
// the rest applies (later batches are still true, but what was lost may
// have removed blocks); when the exchange fails or stops short of to, it is
// cleared after.
func (w *worker) recover(ep, addr string, from, to uint64) {
	ctx, cancel := context.WithTimeout(w.s.ctx, w.s.cfg.ReplayTimeout)
	defer cancel()
	next, partial := from, false
	err := replay(ctx, addr, from, w.s.log, func(seq uint64, payload []byte) bool {
		if seq >= to {
			return false
		}
		if seq < next {
			return true
		}
		if seq > next && !partial {
			partial = true
			w.s.idx.ClearEndpoint(ep)
		}
		w.apply(ep, payload)
		next = seq + 1
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

// errBadReply is returned for a reply that does not follow the protocol.
var errBadReply = errors.New("kvevents: malformed replay reply")

// replay runs one exchange of vLLM's replay protocol with a DEALER socket:
// it sends ["", from] and hands each [_, seq, payload] reply to fn until the
// end marker, until fn returns false, or until ctx ends.
func replay(ctx context.Context, addr string, from uint64, log *slog.Logger, fn func(seq uint64, payload []byte) bool) error {
	// The socket's context ends its dial retries and a blocked Recv.
	sock := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(-1),
		zmq4.WithLogger(slog.NewLogLogger(log.Handler(), slog.LevelDebug)))
	defer sock.Close()
	if err := sock.Dial(addr); err != nil {
		return err
	}
	req := zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, from))
	if err := sock.Send(req); err != nil {
		return err
	}
	for {
		msg, err := sock.Recv()
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
func (w *worker) apply(ep string, payload []byte) {
	m := w.s.m
	b, skipped, err := kvwire.DecodeOptions{SkipTokenIDs: true}.Decode(payload)
	if err != nil {
		m.decodeErrors.Inc()
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
			w.keys = kvwire.Keys(w.keys[:0], ev.BlockHashes)
			if err := w.s.idx.Add(ep, kvindex.TierFromMedium(ev.Medium), w.keys); err != nil {
				m.indexErrors.Inc()
				w.s.log.Debug("kv index refused events", "endpoint", ep, "err", err)
			}
		case kvwire.BlockRemoved:
			w.keys = kvwire.Keys(w.keys[:0], ev.BlockHashes)
			w.s.idx.Remove(ep, kvindex.TierFromMedium(ev.Medium), w.keys)
		case kvwire.AllBlocksCleared:
			w.s.idx.ClearEndpoint(ep)
		}
		m.events.WithLabelValues(ev.Type()).Inc()
	}
}
