package kvwire

import (
	"bytes"
	"fmt"
	"unsafe"
)

// Decode parses one payload. It returns the batch and the number of events
// of unknown type it skipped; events vLLM may add later are counted, not
// errors. Either encoding is accepted for the envelope and for each event.
// Decode never panics, and its allocations are bounded by a small multiple
// of len(payload).
func Decode(payload []byte) (EventBatch, int, error) {
	return DecodeOptions{}.Decode(payload)
}

// DecodeOptions trim what Decode keeps, for consumers that need less.
type DecodeOptions struct {
	// SkipTokenIDs leaves BlockStored.TokenIDs nil: routing needs only the
	// hashes, and the token ids are most of a payload.
	SkipTokenIDs bool
	// Reserve, when set, is asked for the bytes of what Decode is about
	// to keep of the batch (the event list, each event, its hashes,
	// digests and token ids), and a refusal stops Decode with its error.
	// What it granted, the sum of the calls that returned nil, is about
	// what Decode allocated: a consumer can count it against a memory
	// budget, as a payload may decode to 16 times its size (1-byte
	// integer hashes, each a 16-byte Hash).
	Reserve func(n int) error
}

// Decode is the package's Decode with these options.
func (o DecodeOptions) Decode(payload []byte) (EventBatch, int, error) {
	r := reader{b: payload, skipTokens: o.SkipTokenIDs, reserve: o.Reserve}
	var (
		b       EventBatch
		skipped int
		err     error
	)
	c, err := r.peek()
	if err != nil {
		return b, 0, err
	}
	switch {
	case isArrayCode(c):
		skipped, err = r.arrayBatch(&b)
	case isMapCode(c):
		skipped, err = r.mapBatch(&b)
	default:
		err = r.typeErr("event batch (array or map)")
	}
	if err != nil {
		return EventBatch{}, 0, err
	}
	if r.left() != 0 {
		return EventBatch{}, 0, fmt.Errorf("kvwire: %d bytes after the event batch", r.left())
	}
	return b, skipped, nil
}

func isArrayCode(c byte) bool { return c >= 0x90 && c <= 0x9f || c == mArray16 || c == mArray32 }
func isMapCode(c byte) bool   { return c >= 0x80 && c <= 0x8f || c == mMap16 || c == mMap32 }

// arrayBatch reads [ts, events, data_parallel_rank?, ...].
func (r *reader) arrayBatch(b *EventBatch) (int, error) {
	n, err := r.arrayLen()
	if err != nil {
		return 0, err
	}
	if n < 2 {
		return 0, fmt.Errorf("kvwire: event batch has %d fields, want at least ts and events", n)
	}
	if b.TS, err = r.float(); err != nil {
		return 0, fmt.Errorf("kvwire: batch ts: %w", err)
	}
	skipped, err := r.events(b)
	if err != nil {
		return 0, err
	}
	if n >= 3 {
		if b.DataParallelRank, err = r.optInt(); err != nil {
			return 0, fmt.Errorf("kvwire: batch data_parallel_rank: %w", err)
		}
	}
	for range n - 3 {
		if err := r.skip(1); err != nil {
			return 0, err
		}
	}
	return skipped, nil
}

// mapBatch reads {"ts": .., "events": [..], "data_parallel_rank": ..}.
func (r *reader) mapBatch(b *EventBatch) (int, error) {
	n, err := r.mapLen()
	if err != nil {
		return 0, err
	}
	skipped := 0
	for range n {
		key, err := r.str()
		if err != nil {
			return 0, fmt.Errorf("kvwire: batch key: %w", err)
		}
		switch string(key) {
		case "ts":
			b.TS, err = r.float()
		case "events":
			skipped, err = r.events(b)
		case "data_parallel_rank":
			b.DataParallelRank, err = r.optInt()
		default:
			err = r.skip(1)
		}
		if err != nil {
			return 0, fmt.Errorf("kvwire: batch %q: %w", key, err)
		}
	}
	return skipped, nil
}

func (r *reader) events(b *EventBatch) (int, error) {
	n, err := r.arrayLen()
	if err != nil {
		return 0, err
	}
	// n only says what the message claims: preallocate no more events than
	// the bytes left can hold, each kept one taking at least minEventLen.
	capacity := min(n, r.left()/minEventLen)
	if err := r.charge(capacity * eventSlotBytes); err != nil {
		return 0, err
	}
	b.Events = make([]Event, 0, capacity)
	skipped := 0
	for i := range n {
		c, err := r.peek()
		if err != nil {
			return 0, err
		}
		var ev Event
		switch {
		case isArrayCode(c):
			ev, err = r.arrayEvent()
		case isMapCode(c):
			ev, err = r.mapEvent()
		default:
			err = r.typeErr("event (array or map)")
		}
		if err != nil {
			return 0, fmt.Errorf("kvwire: event %d: %w", i, err)
		}
		if ev == nil {
			skipped++
			continue
		}
		if err := r.charge(eventBytes(ev)); err != nil {
			return 0, err
		}
		b.Events = append(b.Events, ev)
	}
	return skipped, nil
}

// Sizes Decode charges to DecodeOptions.Reserve.
const (
	eventSlotBytes = int(unsafe.Sizeof(Event(nil)))
	hashBytes      = int(unsafe.Sizeof(Hash{}))
	// digestBytes is a raw digest's cost besides its bytes: the string
	// header its Hash points to.
	digestBytes = int(unsafe.Sizeof(""))
)

// eventBytes is what an event boxed in an Event holds on the heap besides
// its hash and token slices (charged as they are read).
func eventBytes(ev Event) int {
	switch ev := ev.(type) {
	case BlockStored:
		n := int(unsafe.Sizeof(ev)) + len(ev.Medium) + len(ev.LoRAName)
		if ev.ParentBlockHash != nil {
			n += hashBytes
		}
		if ev.LoRAID != nil {
			n += int(unsafe.Sizeof(0))
		}
		return n
	case BlockRemoved:
		return int(unsafe.Sizeof(ev)) + len(ev.Medium)
	}
	return 0 // AllBlocksCleared: zero-sized, boxed without allocating
}

// minEventLen is the fewest bytes an event Decode keeps takes on the wire:
// ["BlockStored"], a fixarray byte and the type as a fixstr.
const minEventLen = 1 + 1 + len(TypeBlockStored)

// arrayEvent reads ["Type", field, ...]; it returns a nil Event for an
// unknown type, after skipping it.
func (r *reader) arrayEvent() (Event, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("empty event array")
	}
	tag, err := r.str()
	if err != nil {
		return nil, fmt.Errorf("event type: %w", err)
	}
	var fields []string
	switch string(tag) {
	case TypeBlockStored:
		fields = blockStoredFields
	case TypeBlockRemoved:
		fields = blockRemovedFields
	case TypeAllBlocksCleared:
	default:
		for range n - 1 {
			if err := r.skip(1); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	var f eventFields
	for i := range n - 1 {
		name := ""
		if i < len(fields) {
			name = fields[i]
		}
		if err := r.field(&f, name); err != nil {
			return nil, err
		}
	}
	return f.event(string(tag)), nil
}

// mapEvent reads {"type": "Type", "field": value, ...}; it returns a nil
// Event for an unknown type, after skipping it.
func (r *reader) mapEvent() (Event, error) {
	n, err := r.mapLen()
	if err != nil {
		return nil, err
	}
	start := r.off
	var tag string
	if key, err := r.str(); err == nil && string(key) == "type" {
		// msgspec writes the tag first: read it and go on from there.
		v, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("event type: %w", err)
		}
		tag, n = string(v), n-1
	} else {
		// Anywhere else, find it first, then read the fields.
		r.off = start
		if tag, err = r.findType(n); err != nil {
			return nil, err
		}
		if !knownType(tag) {
			return nil, nil
		}
		r.off = start
	}
	var f eventFields
	known := knownType(tag)
	for range n {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("event key: %w", err)
		}
		name := string(key)
		if !known || name == "type" || !fieldOf(tag, name) {
			name = ""
		}
		if err := r.field(&f, name); err != nil {
			return nil, err
		}
	}
	if !known {
		return nil, nil
	}
	return f.event(tag), nil
}

func knownType(tag string) bool {
	return tag == TypeBlockStored || tag == TypeBlockRemoved || tag == TypeAllBlocksCleared
}

// findType scans a map's n pairs for the "type" key and leaves the reader
// after the map.
func (r *reader) findType(n int) (string, error) {
	tag := ""
	for range n {
		key, err := r.str()
		if err != nil {
			return "", fmt.Errorf("event key: %w", err)
		}
		if tag == "" && bytes.Equal(key, []byte("type")) {
			v, err := r.str()
			if err != nil {
				return "", fmt.Errorf("event type: %w", err)
			}
			tag = string(v)
			continue
		}
		if err := r.skip(1); err != nil {
			return "", err
		}
	}
	if tag == "" {
		return "", fmt.Errorf("event map without a type")
	}
	return tag, nil
}

// Field names in vLLM's declaration order, which is also the order of the
// array encoding.
var (
	blockStoredFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	blockRemovedFields = []string{"block_hashes", "medium"}
)

func fieldOf(tag, name string) bool {
	fields := blockStoredFields
	if tag == TypeBlockRemoved {
		fields = blockRemovedFields
	}
	for _, f := range fields {
		if f == name {
			return true
		}
	}
	return false
}

// eventFields collects the fields of any known event type.
type eventFields struct {
	hashes    []Hash
	parent    *Hash
	tokens    []int
	blockSize int
	loraID    *int
	medium    string
	loraName  string
}

func (f *eventFields) event(tag string) Event {
	switch tag {
	case TypeBlockStored:
		return BlockStored{
			BlockHashes: f.hashes, ParentBlockHash: f.parent, TokenIDs: f.tokens,
			BlockSize: f.blockSize, LoRAID: f.loraID, Medium: f.medium, LoRAName: f.loraName,
		}
	case TypeBlockRemoved:
		return BlockRemoved{BlockHashes: f.hashes, Medium: f.medium}
	default:
		return AllBlocksCleared{}
	}
}

// field reads the value of the named field into f; an empty name skips a
// field the decoder does not know.
func (r *reader) field(f *eventFields, name string) error {
	var err error
	switch name {
	case "block_hashes":
		f.hashes, err = r.hashes()
	case "parent_block_hash":
		if !r.nil() {
			var h Hash
			h, err = r.hash()
			f.parent = &h
		}
	case "token_ids":
		if r.skipTokens {
			err = r.skip(1)
		} else {
			f.tokens, err = r.ints()
		}
	case "block_size":
		var v int64
		v, err = r.int()
		f.blockSize = int(v)
	case "lora_id":
		f.loraID, err = r.optInt()
	case "medium":
		f.medium, err = r.optStr()
	case "lora_name":
		f.loraName, err = r.optStr()
	default:
		err = r.skip(1)
	}
	if err != nil && name != "" {
		return fmt.Errorf("%s: %w", name, err)
	}
	return err
}

func (r *reader) hashes() ([]Hash, error) {
	if r.nil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if err := r.present(n, func() error { _, _, err := r.hashKey(); return err }); err != nil {
		return nil, err
	}
	if err := r.charge(n * hashBytes); err != nil {
		return nil, err
	}
	hs := make([]Hash, n)
	for i := range hs {
		if hs[i], err = r.hash(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// trustedLen is the longest array whose slice is allocated before its
// values are read: at most 24 KiB wasted on a message that fails in it
// (a failure ends the decode, so one such array per message), and no
// second pass over the arrays engines send (a prompt's blocks or tokens).
const trustedLen = 1024

// present checks that the next n values all read, then rewinds: a slice
// for more than trustedLen values is allocated only once they are known to
// be there, so a message claiming more values than it holds does not make
// the decoder allocate for them. read must not allocate.
func (r *reader) present(n int, read func() error) error {
	if n <= trustedLen {
		return nil
	}
	start := r.off
	for range n {
		if err := read(); err != nil {
			return err
		}
	}
	r.off = start
	return nil
}

// hash reads an integer hash or a binary digest.
func (r *reader) hash() (Hash, error) {
	key, raw, err := r.hashKey()
	if err != nil || raw == nil {
		return Hash{key: key}, err
	}
	if err := r.charge(digestBytes + len(raw)); err != nil {
		return Hash{}, err
	}
	return rawHash(string(raw)), nil
}

// hashKey reads an integer hash, or a binary digest's bytes (aliasing the
// payload), without allocating.
func (r *reader) hashKey() (uint64, []byte, error) {
	c, err := r.peek()
	if err != nil {
		return 0, nil, err
	}
	if c == mBin8 || c == mBin16 || c == mBin32 {
		p, err := r.bin()
		if err != nil {
			return 0, nil, err
		}
		if len(p) == 0 || len(p) > MaxRawHashLen {
			return 0, nil, fmt.Errorf("binary block hash of %d bytes, want 1 to %d", len(p), MaxRawHashLen)
		}
		return 0, p, nil
	}
	v, err := r.int()
	return uint64(v), nil, err
}

func (r *reader) ints() ([]int, error) {
	if r.nil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if err := r.present(n, func() error { _, err := r.int(); return err }); err != nil {
		return nil, err
	}
	if err := r.charge(n * int(unsafe.Sizeof(0))); err != nil {
		return nil, err
	}
	vs := make([]int, n)
	for i := range vs {
		v, err := r.int()
		if err != nil {
			return nil, err
		}
		vs[i] = int(v)
	}
	return vs, nil
}

func (r *reader) optInt() (*int, error) {
	v, ok, err := r.optIntValue()
	if !ok {
		return nil, err
	}
	return &v, nil
}

// optIntValue reads an optional int; ok is false for nil or an error.
func (r *reader) optIntValue() (v int, ok bool, err error) {
	if r.nil() {
		return 0, false, nil
	}
	i, err := r.int()
	return int(i), err == nil, err
}

// DataParallelRank reads only a batch's data_parallel_rank, without
// allocating: a consumer can tell which rank's stream a message belongs
// to before it queues it. vLLM runs one publisher per data-parallel rank
// and tags every batch with it. ok is false when the batch carries none or
// does not parse; the array form puts the rank after the events, so it
// walks them.
func DataParallelRank(payload []byte) (rank int, ok bool) {
	r := reader{b: payload}
	c, err := r.peek()
	if err != nil {
		return 0, false
	}
	switch {
	case isArrayCode(c):
		rank, ok, err = r.arrayRank()
	case isMapCode(c):
		rank, ok, err = r.mapRank()
	}
	return rank, ok && err == nil
}

// arrayRank reads the third field of [ts, events, data_parallel_rank, ...].
func (r *reader) arrayRank() (int, bool, error) {
	n, err := r.arrayLen()
	if err != nil || n < 3 {
		return 0, false, err
	}
	for range 2 {
		if err := r.skip(1); err != nil {
			return 0, false, err
		}
	}
	return r.optIntValue()
}

// mapRank finds the "data_parallel_rank" key of a batch map.
func (r *reader) mapRank() (int, bool, error) {
	n, err := r.mapLen()
	if err != nil {
		return 0, false, err
	}
	for range n {
		key, err := r.str()
		if err != nil {
			return 0, false, err
		}
		if string(key) == "data_parallel_rank" {
			return r.optIntValue()
		}
		if err := r.skip(1); err != nil {
			return 0, false, err
		}
	}
	return 0, false, nil
}
