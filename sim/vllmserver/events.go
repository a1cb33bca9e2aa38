package vllmserver

import (
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/sim/engine"
)

// eventSink publishes each engine step's KV-cache events as one batch, as
// vLLM does. The Runner calls it with its lock held; Publisher.Publish
// encodes and queues without touching the network, so it never blocks: a
// subscriber that reads slowly loses batches from its bounded queue, one
// that stops reading is disconnected (internal/zmtp.Pub), and neither can
// stall the engine.
type eventSink struct {
	pub     *kvwire.Publisher
	loraIDs map[string]int // immutable
	log     *slog.Logger
	buf     []kvwire.Event // reused: calls are serialized by the Runner's lock
}

func newEventSink(pub *kvwire.Publisher, loraIDs map[string]int, log *slog.Logger) *eventSink {
	return &eventSink{pub: pub, loraIDs: loraIDs, log: log}
}

// Publish implements engine.EventSink.
func (s *eventSink) Publish(events []engine.Event) {
	s.buf = s.buf[:0]
	for _, ev := range events {
		if out, ok := s.convert(ev); ok {
			s.buf = append(s.buf, out)
		}
	}
	if len(s.buf) == 0 {
		return
	}
	batch := kvwire.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: s.buf}
	if err := s.pub.Publish(batch); err != nil {
		s.log.Debug("KV events batch not published", "err", err)
	}
	clear(s.buf) // the batch is encoded; do not pin its token slices
}

func (s *eventSink) convert(ev engine.Event) (kvwire.Event, bool) {
	switch e := ev.(type) {
	case *engine.BlockStored:
		out := kvwire.BlockStored{
			BlockHashes: hashes(e.BlockHashes), TokenIDs: e.TokenIDs, BlockSize: e.BlockSize,
			Medium: e.Medium, LoRAName: e.LoRAName,
		}
		if e.HasParent {
			p := kvwire.Uint64Hash(e.ParentBlockHash)
			out.ParentBlockHash = &p
		}
		if id, ok := s.loraIDs[e.LoRAName]; ok {
			out.LoRAID = &id
		}
		return out, true
	case *engine.BlockRemoved:
		return kvwire.BlockRemoved{BlockHashes: hashes(e.BlockHashes), Medium: e.Medium}, true
	case *engine.AllBlocksCleared:
		return kvwire.AllBlocksCleared{}, true
	}
	return nil, false
}

func hashes(vs []uint64) []kvwire.Hash {
	out := make([]kvwire.Hash, len(vs))
	for i, v := range vs {
		out[i] = kvwire.Uint64Hash(v)
	}
	return out
}
