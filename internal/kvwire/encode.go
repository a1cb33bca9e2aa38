package kvwire

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how events and the envelope are laid out.
type Encoding uint8

const (
	// EncodingArray is vLLM's array_like msgspec form, which every vLLM
	// version reads: [ts, [["BlockStored", ...], ...], dp_rank].
	EncodingArray Encoding = iota
	// EncodingMap is the newer keyed form: {"ts": .., "events": [{"type":
	// "BlockStored", ...}], "data_parallel_rank": ..} without nil fields.
	EncodingMap
)

func (e Encoding) String() string {
	if e == EncodingMap {
		return "map"
	}
	return "array"
}

// ParseEncoding reads "array" or "map" (the names String gives).
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "array", "":
		return EncodingArray, nil
	case "map":
		return EncodingMap, nil
	}
	return 0, fmt.Errorf("kvwire: unknown encoding %q (want array or map)", s)
}

// Encode serializes a batch the way vLLM's msgspec encoder does: integers
// in their smallest msgpack form, ts as float64, digests as bin, and in the
// array form every event field present (nil when unset) while the envelope
// omits a nil data_parallel_rank, as msgspec's omit_defaults drops a
// trailing default.
func Encode(b EventBatch, enc Encoding) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.GetEncoder()
	defer func() {
		e.Reset(nil) // the pooled encoder must not keep buf alive
		msgpack.PutEncoder(e)
	}()
	e.Reset(&buf)
	w := writer{e: e}
	if enc == EncodingMap {
		w.mapBatch(b)
	} else {
		w.arrayBatch(b)
	}
	if w.err != nil {
		return nil, fmt.Errorf("kvwire: encode: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer keeps the first encoder error so the layout code reads straight.
type writer struct {
	e   *msgpack.Encoder
	err error
}

func (w *writer) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrayBatch(b EventBatch) {
	n := 2
	if b.DataParallelRank != nil {
		n = 3
	}
	w.do(w.e.EncodeArrayLen(n))
	w.do(w.e.EncodeFloat64(b.TS))
	w.do(w.e.EncodeArrayLen(len(b.Events)))
	for _, ev := range b.Events {
		w.arrayEvent(ev)
	}
	if b.DataParallelRank != nil {
		w.do(w.e.EncodeInt(int64(*b.DataParallelRank)))
	}
}

func (w *writer) mapBatch(b EventBatch) {
	n := 2
	if b.DataParallelRank != nil {
		n = 3
	}
	w.do(w.e.EncodeMapLen(n))
	w.do(w.e.EncodeString("ts"))
	w.do(w.e.EncodeFloat64(b.TS))
	w.do(w.e.EncodeString("events"))
	w.do(w.e.EncodeArrayLen(len(b.Events)))
	for _, ev := range b.Events {
		w.mapEvent(ev)
	}
	if b.DataParallelRank != nil {
		w.do(w.e.EncodeString("data_parallel_rank"))
		w.do(w.e.EncodeInt(int64(*b.DataParallelRank)))
	}
}

func (w *writer) arrayEvent(ev Event) {
	switch ev := ev.(type) {
	case BlockStored:
		w.do(w.e.EncodeArrayLen(1 + len(blockStoredFields)))
		w.do(w.e.EncodeString(TypeBlockStored))
		w.hashes(ev.BlockHashes)
		w.optHash(ev.ParentBlockHash)
		w.ints(ev.TokenIDs)
		w.do(w.e.EncodeInt(int64(ev.BlockSize)))
		w.optInt(ev.LoRAID)
		w.optStr(ev.Medium)
		w.optStr(ev.LoRAName)
	case BlockRemoved:
		w.do(w.e.EncodeArrayLen(1 + len(blockRemovedFields)))
		w.do(w.e.EncodeString(TypeBlockRemoved))
		w.hashes(ev.BlockHashes)
		w.optStr(ev.Medium)
	case AllBlocksCleared:
		w.do(w.e.EncodeArrayLen(1))
		w.do(w.e.EncodeString(TypeAllBlocksCleared))
	default:
		w.do(fmt.Errorf("event type %T", ev))
	}
}

func (w *writer) mapEvent(ev Event) {
	switch ev := ev.(type) {
	case BlockStored:
		n := 4 // type, block_hashes, token_ids, block_size
		for _, set := range []bool{ev.ParentBlockHash != nil, ev.LoRAID != nil, ev.Medium != "", ev.LoRAName != ""} {
			if set {
				n++
			}
		}
		w.do(w.e.EncodeMapLen(n))
		w.key("type")
		w.do(w.e.EncodeString(TypeBlockStored))
		w.key("block_hashes")
		w.hashes(ev.BlockHashes)
		if ev.ParentBlockHash != nil {
			w.key("parent_block_hash")
			w.hash(*ev.ParentBlockHash)
		}
		w.key("token_ids")
		w.ints(ev.TokenIDs)
		w.key("block_size")
		w.do(w.e.EncodeInt(int64(ev.BlockSize)))
		if ev.LoRAID != nil {
			w.key("lora_id")
			w.do(w.e.EncodeInt(int64(*ev.LoRAID)))
		}
		if ev.Medium != "" {
			w.key("medium")
			w.do(w.e.EncodeString(ev.Medium))
		}
		if ev.LoRAName != "" {
			w.key("lora_name")
			w.do(w.e.EncodeString(ev.LoRAName))
		}
	case BlockRemoved:
		n := 2
		if ev.Medium != "" {
			n++
		}
		w.do(w.e.EncodeMapLen(n))
		w.key("type")
		w.do(w.e.EncodeString(TypeBlockRemoved))
		w.key("block_hashes")
		w.hashes(ev.BlockHashes)
		if ev.Medium != "" {
			w.key("medium")
			w.do(w.e.EncodeString(ev.Medium))
		}
	case AllBlocksCleared:
		w.do(w.e.EncodeMapLen(1))
		w.key("type")
		w.do(w.e.EncodeString(TypeAllBlocksCleared))
	default:
		w.do(fmt.Errorf("event type %T", ev))
	}
}

func (w *writer) key(k string) { w.do(w.e.EncodeString(k)) }

func (w *writer) hashes(hs []Hash) {
	w.do(w.e.EncodeArrayLen(len(hs)))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) hash(h Hash) {
	if h.raw != nil {
		w.do(w.e.EncodeBytes([]byte(*h.raw)))
		return
	}
	w.do(w.e.EncodeUint(h.key))
}

func (w *writer) optHash(h *Hash) {
	if h == nil {
		w.do(w.e.EncodeNil())
		return
	}
	w.hash(*h)
}

func (w *writer) ints(vs []int) {
	w.do(w.e.EncodeArrayLen(len(vs)))
	for _, v := range vs {
		w.do(w.e.EncodeInt(int64(v)))
	}
}

func (w *writer) optInt(v *int) {
	if v == nil {
		w.do(w.e.EncodeNil())
		return
	}
	w.do(w.e.EncodeInt(int64(*v)))
}

func (w *writer) optStr(s string) {
	if s == "" {
		w.do(w.e.EncodeNil())
		return
	}
	w.do(w.e.EncodeString(s))
}
