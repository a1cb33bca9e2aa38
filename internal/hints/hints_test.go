package hints

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func headerMap(h Hints) map[string]string {
	m := map[string]string{}
	h.Encode(func(k, v string) { m[k] = v })
	return m
}

func getter(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func randomHashes(n int) []uint64 {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = r.Uint64()
	}
	return hs
}

func TestRoundTrip(t *testing.T) {
	p, err := NewPrefix(Approximate, 16, 0xdeadbeef, randomHashes(300), 256)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []Hints{
		{Model: "Qwen/Qwen3-0.6B", PromptLen: 12},
		{Model: "m", Stream: true, PromptLen: 0, MaxTokens: 7, Prefix: &p},
		{Model: "weird name%é\n", PromptLen: 1 << 30},
	} {
		m := headerMap(h)
		for k, v := range m {
			for i := 0; i < len(v); i++ {
				if v[i] < ' ' || v[i] >= 0x7f {
					t.Fatalf("%s has non-printable byte in %q", k, v)
				}
			}
		}
		got, err := Decode(getter(m))
		if err != nil {
			t.Fatalf("Decode(%v): %v", m, err)
		}
		if got.Model != h.Model || got.Stream != h.Stream || got.PromptLen != h.PromptLen || got.MaxTokens != h.MaxTokens {
			t.Fatalf("got %+v, want %+v", got, h)
		}
		if (got.Prefix == nil) != (h.Prefix == nil) {
			t.Fatalf("prefix presence differs")
		}
		if h.Prefix != nil && got.Prefix.Encode() != h.Prefix.Encode() {
			t.Fatalf("prefix differs")
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	valid := headerMap(Hints{Model: "m", PromptLen: 3})
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range valid {
			m[a] = b
		}
		if v == "<absent>" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	if _, err := Decode(getter(map[string]string{})); !errors.Is(err, ErrNoHints) {
		t.Fatalf("empty map: %v", err)
	}
	for _, tc := range []struct{ name, key, val string }{
		{"empty model", HeaderModel, ""},
		{"raw space in model", HeaderModel, "a b"},
		{"bad escape", HeaderModel, "a%zz"},
		{"truncated escape", HeaderModel, "a%4"},
		{"stream missing", HeaderStream, "<absent>"},
		{"stream yes", HeaderStream, "yes"},
		{"prompt-len missing", HeaderPromptLen, "<absent>"},
		{"prompt-len negative", HeaderPromptLen, "-1"},
		{"prompt-len leading zero", HeaderPromptLen, "01"},
		{"prompt-len huge", HeaderPromptLen, "99999999999"},
		{"max-tokens empty", HeaderMaxTokens, ""},
		{"prefix garbage", HeaderPrefixKey, "garbage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(getter(with(tc.key, tc.val)))
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("want ErrMalformed, got %v", err)
			}
		})
	}
}

func TestDecodePrefixErrors(t *testing.T) {
	p, _ := NewPrefix(Precise, 16, 42, randomHashes(3), 64)
	good := p.Encode()
	if _, err := DecodePrefix(good); err != nil {
		t.Fatalf("valid %q: %v", good, err)
	}
	h := good[strings.Index(good, ";h=")+3:]
	for _, v := range []string{
		"",
		"2;m=p;b=16;s=2a;n=3;k=64;h=" + h,
		"1;m=x;b=16;s=2a;n=3;k=64;h=" + h,
		"1;m=p;b=0;s=2a;n=3;k=64;h=" + h,
		"1;m=p;b=16;s=02a;n=3;k=64;h=" + h,
		"1;m=p;b=16;s=2A;n=3;k=64;h=" + h,
		"1;m=p;b=16;s=12345678901234567;n=3;k=64;h=" + h,
		"1;m=p;b=16;s=2a;n=4;k=64;h=" + h,
		"1;m=p;b=16;s=2a;n=3;k=0;h=" + h,
		"1;m=p;b=16;s=2a;n=3;k=64;h=" + h[1:],
		"1;m=p;b=16;s=2a;n=3;k=64;h=" + h[:len(h)-1] + "!",
		"1;m=p;b=16;s=2a;n=3;k=64;h=" + h[:len(h)-1] + "B", // stray low bits
		"1;m=p;b=16;s=2a;n=3;k=64;x=" + h,
		"1;m=p;b=16;s=2a;k=64;n=3;h=" + h,
		"1;m=p;b=16;s=2a;n=16777217;k=1;h=",
		"1;m=p;b=16;s=2a;n=3;k=64;h=" + h + ";",
	} {
		if _, err := DecodePrefix(v); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodePrefix(%q) = %v, want ErrMalformed", v, err)
		}
	}
}

func TestSampling(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want []int
	}{
		{0, 4, nil},
		{1, 4, []int{0}},
		{4, 4, []int{0, 1, 2, 3}},
		// region 0: 0..3, region 1: 4,6,8,10, region 2: 12,16,20,24, region 3: 28
		{30, 4, []int{0, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 29}},
		{13, 4, []int{0, 1, 2, 3, 4, 6, 8, 10, 12}},
	} {
		var got []int
		forEachSample(tc.n, tc.k, func(i int) { got = append(got, i) })
		if len(got) != len(tc.want) || SampleCount(tc.n, tc.k) != len(tc.want) {
			t.Fatalf("n=%d k=%d: got %v, want %v", tc.n, tc.k, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("n=%d k=%d: got %v, want %v", tc.n, tc.k, got, tc.want)
			}
		}
	}
}

// TestHeaderSize pins the documented bound: under 8 KB (7 KB in fact) for
// a 1M-token prompt and for the largest n the decoder accepts.
func TestHeaderSize(t *testing.T) {
	for _, tc := range []struct {
		blocks, wantK int
	}{
		{256, 256},           // approximate default: every block, exact match
		{1_000_000 / 16, 59}, // 1M tokens, 16-token blocks
		{1 << 20, 0},
	} {
		p, err := NewPrefix(Precise, 16, ^uint64(0), randomHashes(tc.blocks), 256)
		if err != nil {
			t.Fatal(err)
		}
		v := p.Encode()
		if len(v) >= 7*1024 {
			t.Errorf("n=%d: header is %d bytes", tc.blocks, len(v))
		}
		if tc.wantK != 0 && p.Dense != tc.wantK {
			t.Errorf("n=%d: k=%d, want %d", tc.blocks, p.Dense, tc.wantK)
		}
		t.Logf("n=%d k=%d samples=%d header=%d bytes", tc.blocks, p.Dense, len(p.Samples), len(v))
		if _, err := DecodePrefix(v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSmallestDenseFits pins what NewPrefix relies on: k = 1 fits for every
// n the decoder accepts.
func TestSmallestDenseFits(t *testing.T) {
	if c := SampleCount(MaxBlocks, 1); c > MaxSamples {
		t.Fatalf("SampleCount(MaxBlocks, 1) = %d > %d", c, MaxSamples)
	}
}

func TestMatchedBlocks(t *testing.T) {
	hs := randomHashes(30)
	p, err := NewPrefix(Approximate, 16, 1, hs, 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ cachedBlocks, want int }{
		{0, 0}, {3, 3}, {5, 5}, {6, 5}, {7, 7}, {27, 25}, {29, 29}, {30, 30},
	} {
		cached := map[uint64]bool{}
		for _, h := range hs[:tc.cachedBlocks] {
			cached[h] = true
		}
		got := p.MatchedBlocks(func(h uint64) bool { return cached[h] })
		if got != tc.want {
			t.Errorf("cached %d: matched %d, want %d", tc.cachedBlocks, got, tc.want)
		}
		// The documented bound: never more than the truth, never short by
		// a stride or more.
		if got > tc.cachedBlocks {
			t.Errorf("cached %d: overestimated %d", tc.cachedBlocks, got)
		}
	}
}

func TestIsHintHeader(t *testing.T) {
	for name, want := range map[string]bool{
		"x-kvgate-model": true, "X-KVGate-Anything": true, "x-kvgate-": true,
		"x-kvgat": false, "x-gateway-destination-endpoint": false, "": false,
	} {
		if IsHintHeader(name) != want {
			t.Errorf("IsHintHeader(%q) != %v", name, want)
		}
	}
}

func FuzzDecodePrefix(f *testing.F) {
	for _, n := range []int{0, 1, 5, 300} {
		p, _ := NewPrefix(Approximate, 16, uint64(n), randomHashes(n), 8)
		f.Add(p.Encode())
	}
	f.Add("1;m=p;b=16;s=0;n=0;k=1;h=")
	f.Add("1;m=a;b=65536;s=ffffffffffffffff;n=16777216;k=4096;h=")
	f.Fuzz(func(t *testing.T, v string) {
		p, err := DecodePrefix(v)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		// Canonical: what decodes re-encodes to the same bytes.
		if got := p.Encode(); got != v {
			t.Fatalf("re-encoded %q, want %q", got, v)
		}
	})
}

func FuzzDecode(f *testing.F) {
	f.Add("m", "true", "12", "3", "1;m=p;b=16;s=0;n=0;k=1;h=")
	f.Add("a%25b", "false", "0", "", "")
	f.Fuzz(func(t *testing.T, model, stream, promptLen, maxTokens, prefix string) {
		m := map[string]string{HeaderModel: model, HeaderStream: stream, HeaderPromptLen: promptLen}
		if maxTokens != "" {
			m[HeaderMaxTokens] = maxTokens
		}
		if prefix != "" {
			m[HeaderPrefixKey] = prefix
		}
		h, err := Decode(getter(m))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		again, err := Decode(getter(headerMap(h)))
		if err != nil || again.Model != h.Model || again.PromptLen != h.PromptLen {
			t.Fatalf("re-encode of %+v: %+v, %v", h, again, err)
		}
	})
}
