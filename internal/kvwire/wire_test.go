package kvwire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// hx builds bytes from hex pieces and quoted text: hx("92", `"ts"`) is
// 0x92 followed by the bytes of "ts". Spaces in hex pieces are ignored.
func hx(t testing.TB, parts ...string) []byte {
	t.Helper()
	var out []byte
	for _, p := range parts {
		if strings.HasPrefix(p, `"`) {
			out = append(out, strings.Trim(p, `"`)...)
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(p, " ", ""))
		if err != nil {
			t.Fatalf("bad hex %q: %v", p, err)
		}
		out = append(out, b...)
	}
	return out
}

func intp(v int) *int { return &v }

func digest(seed byte) []byte {
	d := make([]byte, 32)
	for i := range d {
		d[i] = seed + byte(i)
	}
	return d
}

// goldenArray is what vLLM's msgspec encoder emits for goldenArrayBatch:
// array-like structs, smallest integer forms, float64 ts, every event field
// present, and no data_parallel_rank since it is the trailing default.
func goldenArray(t testing.TB) []byte {
	return hx(t,
		"92",                  // EventBatch [ts, events]
		"cb 3ff8000000000000", // ts 1.5
		"93",                  // 3 events
		"98", "ab", `"BlockStored"`,
		"92 01 cf ffffffffffffffff", // block_hashes [1, 2^64-1]
		"c0",                        // parent_block_hash nil
		"93 01 02 cd012c",           // token_ids [1, 2, 300]
		"10",                        // block_size 16
		"c0",                        // lora_id nil
		"a3", `"GPU"`,               // medium
		"c0", // lora_name nil
		"93", "ac", `"BlockRemoved"`, "91 07", "a3", `"CPU"`,
		"91", "b0", `"AllBlocksCleared"`,
	)
}

func goldenArrayBatch() EventBatch {
	return EventBatch{TS: 1.5, Events: []Event{
		BlockStored{BlockHashes: []Hash{Uint64Hash(1), Uint64Hash(math.MaxUint64)}, TokenIDs: []int{1, 2, 300}, BlockSize: 16, Medium: MediumGPU},
		BlockRemoved{BlockHashes: []Hash{Uint64Hash(7)}, Medium: MediumCPU},
		AllBlocksCleared{},
	}}
}

// goldenMap is the keyed form with every optional field set and a raw
// sha256 digest as the block hash.
func goldenMap(t testing.TB) []byte {
	return hx(t,
		"83",
		"a2", `"ts"`, "cb 3ff8000000000000",
		"a6", `"events"`, "91",
		"88",
		"a4", `"type"`, "ab", `"BlockStored"`,
		"ac", `"block_hashes"`, "91 c420", hex.EncodeToString(digest(0x10)),
		"b1", `"parent_block_hash"`, "05",
		"a9", `"token_ids"`, "92 01 02",
		"aa", `"block_size"`, "10",
		"a7", `"lora_id"`, "03",
		"a6", `"medium"`, "a3", `"GPU"`,
		"a9", `"lora_name"`, "a3", `"sql"`,
		"b2", `"data_parallel_rank"`, "02",
	)
}

func goldenMapBatch() EventBatch {
	parent := Uint64Hash(5)
	return EventBatch{TS: 1.5, DataParallelRank: intp(2), Events: []Event{
		BlockStored{BlockHashes: []Hash{BytesHash(digest(0x10))}, ParentBlockHash: &parent, TokenIDs: []int{1, 2}, BlockSize: 16, LoRAID: intp(3), Medium: MediumGPU, LoRAName: "sql"},
	}}
}

func TestEncodeGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch EventBatch
		enc   Encoding
		want  []byte
	}{
		{"array", goldenArrayBatch(), EncodingArray, goldenArray(t)},
		{"map", goldenMapBatch(), EncodingMap, goldenMap(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Encode(tc.batch, tc.enc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("Encode =\n%x\nwant\n%x", got, tc.want)
			}
			back, skipped, err := Decode(got)
			if err != nil || skipped != 0 {
				t.Fatalf("Decode: %v (skipped %d)", err, skipped)
			}
			if !reflect.DeepEqual(back, tc.batch) {
				t.Fatalf("round trip =\n%+v\nwant\n%+v", back, tc.batch)
			}
		})
	}
}

func TestHashKey(t *testing.T) {
	d := digest(0xa0)
	h := BytesHash(d)
	if got, want := h.Key(), uint64(0xb8b9babbbcbdbebf); got != want || !h.IsRaw() || !bytes.Equal(h.Raw(), d) {
		t.Fatalf("BytesHash: key %x raw %v %x, want key %x", got, h.IsRaw(), h.Raw(), want)
	}
	if got := BytesHash([]byte{1, 2}).Key(); got != 0x0102 {
		t.Fatalf("short digest key = %x, want 102", got)
	}
	if h := Uint64Hash(42); h.Key() != 42 || h.IsRaw() || h.Raw() != nil {
		t.Fatalf("Uint64Hash = %+v", h)
	}
	if got := Keys(nil, []Hash{Uint64Hash(3), BytesHash(d)}); !reflect.DeepEqual(got, []uint64{3, 0xb8b9babbbcbdbebf}) {
		t.Fatalf("Keys = %x", got)
	}
}

// omap is an ordered msgpack map for building test payloads.
type omap []any

func (m omap) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m) / 2); err != nil {
		return err
	}
	for _, v := range m {
		if err := e.Encode(v); err != nil {
			return err
		}
	}
	return nil
}

func mp(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeVariants(t *testing.T) {
	stored := func(medium, lora string) BlockStored {
		return BlockStored{BlockHashes: []Hash{Uint64Hash(9)}, TokenIDs: []int{4}, BlockSize: 16, Medium: medium, LoRAName: lora}
	}
	tests := []struct {
		name    string
		payload any
		want    EventBatch
		skipped int
	}{
		{
			name:    "array batch with rank and an extra trailing field",
			payload: []any{2.0, []any{}, 1, "future"},
			want:    EventBatch{TS: 2, Events: []Event{}, DataParallelRank: intp(1)},
		},
		{
			name:    "integer ts and nil rank",
			payload: []any{int64(3), []any{}, nil},
			want:    EventBatch{TS: 3, Events: []Event{}},
		},
		{
			name:    "old BlockStored without medium and lora_name",
			payload: []any{1.0, []any{[]any{"BlockStored", []any{9}, nil, []any{4}, 16, nil}}},
			want:    EventBatch{TS: 1, Events: []Event{stored("", "")}},
		},
		{
			name:    "BlockStored with a field from a future version",
			payload: []any{1.0, []any{[]any{"BlockStored", []any{9}, nil, []any{4}, 16, nil, "CPU", "a", []any{"extra"}}}},
			want:    EventBatch{TS: 1, Events: []Event{stored("CPU", "a")}},
		},
		{
			name:    "old BlockRemoved without medium",
			payload: []any{1.0, []any{[]any{"BlockRemoved", []any{9, 10}}}},
			want:    EventBatch{TS: 1, Events: []Event{BlockRemoved{BlockHashes: []Hash{Uint64Hash(9), Uint64Hash(10)}}}},
		},
		{
			name:    "signed hash from Python's hash()",
			payload: []any{1.0, []any{[]any{"BlockRemoved", []any{int64(-2)}, "GPU"}}},
			want:    EventBatch{TS: 1, Events: []Event{BlockRemoved{BlockHashes: []Hash{Uint64Hash(math.MaxUint64 - 1)}, Medium: "GPU"}}},
		},
		{
			name:    "unknown event types are skipped",
			payload: []any{1.0, []any{[]any{"BlockMoved", 1, 2}, []any{"AllBlocksCleared"}, omap{"type", "Future", "x", []any{1}}}},
			want:    EventBatch{TS: 1, Events: []Event{AllBlocksCleared{}}},
			skipped: 2,
		},
		{
			name: "map envelope, array events",
			payload: omap{"events", []any{[]any{"BlockStored", []any{9}, nil, []any{4}, 16, nil, nil, nil}},
				"ts", 1.0, "unknown", omap{"a", 1}},
			want: EventBatch{TS: 1, Events: []Event{stored("", "")}},
		},
		{
			name: "array envelope, map events with type last and unknown keys",
			payload: []any{1.0, []any{
				omap{"block_hashes", []any{9}, "token_ids", []any{4}, "block_size", 16, "extra_keys", []any{"x"}, "medium", "CPU", "type", "BlockStored"},
				omap{"type", "BlockRemoved", "block_hashes", []any{9}, "token_ids", "ignored"},
			}},
			want: EventBatch{TS: 1, Events: []Event{stored("CPU", ""), BlockRemoved{BlockHashes: []Hash{Uint64Hash(9)}}}},
		},
		{
			name:    "float32 ts",
			payload: []any{float32(0.5), []any{}},
			want:    EventBatch{TS: 0.5, Events: []Event{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped, err := Decode(mp(t, tt.payload))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) || skipped != tt.skipped {
				t.Fatalf("Decode =\n%+v (skipped %d)\nwant\n%+v (skipped %d)", got, skipped, tt.want, tt.skipped)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	var typeErr *TypeError
	tests := []struct {
		name    string
		payload []byte
		is      error
		as      any
	}{
		{"empty", nil, ErrTruncated, nil},
		{"not a container", hx(t, "01"), nil, &typeErr},
		{"truncated ts", hx(t, "92 cb 3ff8"), ErrTruncated, nil},
		{"hostile array length", hx(t, "92 cb 3ff8000000000000 dd ffffffff"), ErrTruncated, nil},
		{"hostile map length", hx(t, "df ffffffff"), ErrTruncated, nil},
		{"hostile string length", hx(t, "81 db ffffffff"), ErrTruncated, nil},
		{"hostile bin hash", hx(t, "92 00 91 92", "ac", `"BlockRemoved"`, "91 c6 ffffffff"), ErrTruncated, nil},
		{"too few batch fields", mp(t, []any{1.0}), nil, nil},
		{"events not a list", mp(t, []any{1.0, "x"}), nil, &typeErr},
		{"event not a container", mp(t, []any{1.0, []any{7}}), nil, &typeErr},
		{"empty event array", mp(t, []any{1.0, []any{[]any{}}}), nil, nil},
		{"map event without type", mp(t, []any{1.0, []any{omap{"block_hashes", []any{}}}}), nil, nil},
		{"hash of wrong type", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{"x"}}}}), nil, &typeErr},
		{"digest too long", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{make([]byte, 65)}}}}), nil, nil},
		{"empty digest", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{}}}}}), nil, nil},
		{"trailing bytes", append(mp(t, []any{1.0, []any{}}), 0), nil, nil},
		{"deep nesting in a skipped field", append(hx(t, "93 00 90"), bytes.Repeat([]byte{0x91}, 100)...), nil, nil},
		{"invalid code 0xc1", hx(t, "93 00 90 c1"), nil, &typeErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Decode(tt.payload)
			if err == nil {
				t.Fatal("Decode succeeded, want an error")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("err = %v, want %v", err, tt.is)
			}
			if tt.as != nil && !errors.As(err, tt.as) {
				t.Fatalf("err = %v, want a %T", err, tt.as)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	parent := BytesHash(digest(1))
	batches := []EventBatch{
		goldenArrayBatch(),
		goldenMapBatch(),
		{TS: 0, Events: []Event{}},
		{TS: -1e9, DataParallelRank: intp(0), Events: []Event{
			BlockStored{BlockHashes: []Hash{BytesHash(digest(2)), BytesHash([]byte{1, 2, 3})}, ParentBlockHash: &parent, TokenIDs: []int{-1, 1 << 40}, BlockSize: 1 << 20, LoRAID: intp(-5)},
			BlockRemoved{BlockHashes: []Hash{}},
		}},
	}
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		for i, b := range batches {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := Decode(p)
			if err != nil {
				t.Fatalf("%v batch %d: %v", enc, i, err)
			}
			if !reflect.DeepEqual(got, b) {
				t.Fatalf("%v batch %d: round trip\n%+v\nwant\n%+v", enc, i, got, b)
			}
		}
	}
}

func TestDecodeSkipTokenIDs(t *testing.T) {
	for _, payload := range [][]byte{goldenArray(t), goldenMap(t)} {
		full, _, err := Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		lean, _, err := DecodeOptions{SkipTokenIDs: true}.Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		stored := full.Events[0].(BlockStored)
		stored.TokenIDs = nil
		full.Events[0] = stored
		if !reflect.DeepEqual(lean, full) {
			t.Fatalf("SkipTokenIDs decode =\n%+v\nwant\n%+v", lean, full)
		}
	}
}

func TestParseEncoding(t *testing.T) {
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		if got, err := ParseEncoding(enc.String()); err != nil || got != enc {
			t.Fatalf("ParseEncoding(%q) = %v, %v", enc, got, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Fatal("ParseEncoding(json) succeeded")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(goldenArray(f))
	f.Add(goldenMap(f))
	f.Add(mp(f, []any{1.0, []any{omap{"block_hashes", []any{9}, "type", "BlockStored"}, []any{"X", 1}}, 3}))
	f.Add(hx(f, "92 cb 3ff8000000000000 dd ffffffff"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		_, _, _ = DecodeOptions{SkipTokenIDs: true}.Decode(payload)
		b, _, err := Decode(payload)
		if err != nil || math.IsNaN(b.TS) {
			return
		}
		// Whatever decodes must survive re-encoding in both forms.
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("re-encode %v: %v", enc, err)
			}
			again, _, err := Decode(p)
			if err != nil {
				t.Fatalf("decode of re-encoded %v: %v", enc, err)
			}
			if len(again.Events) != len(b.Events) || again.TS != b.TS {
				t.Fatalf("%v round trip changed the batch: %+v vs %+v", enc, again, b)
			}
		}
	})
}

// TestDataParallelRank reads the rank of batches in both encodings
// without allocating, and reports none where a batch carries none.
func TestDataParallelRank(t *testing.T) {
	rank := 3
	events := []Event{BlockStored{BlockHashes: []Hash{Uint64Hash(1), BytesHash([]byte{1, 2})}, BlockSize: 16}, AllBlocksCleared{}}
	tests := []struct {
		name  string
		batch EventBatch
		want  int
		ok    bool
	}{
		{"rank", EventBatch{TS: 1, Events: events, DataParallelRank: &rank}, 3, true},
		{"rank 0", EventBatch{TS: 1, Events: events, DataParallelRank: new(int)}, 0, true},
		{"none", EventBatch{TS: 1, Events: events}, 0, false},
	}
	for _, tt := range tests {
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			t.Run(tt.name+"/"+enc.String(), func(t *testing.T) {
				payload, err := Encode(tt.batch, enc)
				if err != nil {
					t.Fatal(err)
				}
				if got, ok := DataParallelRank(payload); got != tt.want || ok != tt.ok {
					t.Fatalf("DataParallelRank = %d, %v; want %d, %v", got, ok, tt.want, tt.ok)
				}
				if n := testing.AllocsPerRun(10, func() { DataParallelRank(payload) }); n != 0 {
					t.Fatalf("DataParallelRank allocated %v times", n)
				}
				// The array form ends with the rank.
				if _, ok := DataParallelRank(payload[:len(payload)-1]); ok && enc == EncodingArray {
					t.Fatal("a truncated batch gave a rank")
				}
			})
		}
	}
	// vLLM's array form with a nil rank, and garbage.
	for _, p := range [][]byte{{0x93, 0x00, 0x90, mNil}, {0xc1}, nil} {
		if _, ok := DataParallelRank(p); ok {
			t.Errorf("DataParallelRank(%x) found a rank", p)
		}
	}
}
