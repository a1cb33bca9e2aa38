package testutil

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func TestStreamOrder(t *testing.T) {
	for _, tc := range []struct {
		name, body, first string
		err               error
	}{
		{"first of several", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n", `{"a":1}`, nil},
		{"crlf and comments", ": ping\r\n\r\ndata:x\r\n\r\n", "x", nil},
		{"no newline at the end", "data: last", "last", nil},
		{"no data", ": only a comment\n\n", "", ErrNoSSEData},
		{"empty", "", "", ErrNoSSEData},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			err := StreamOrder(strings.NewReader(tc.body), func(d []byte) { got = append(got, string(d)) })
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if tc.err == nil && (len(got) != 1 || got[0] != tc.first) {
				t.Fatalf("first called with %q, want once with %q", got, tc.first)
			}
			if tc.err != nil && len(got) != 0 {
				t.Fatalf("first called with %q on a stream without data", got)
			}
		})
	}
}

func TestSSEReader(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []SSEEvent
	}{
		{"one data line each", "data: a\n\ndata: [DONE]\n\n", []SSEEvent{{Data: []string{"a"}}, {Data: []string{"[DONE]"}}}},
		{"crlf, no space, extra blank lines", "\r\ndata:a\r\n\r\n\r\ndata: b\r\n\r\n", []SSEEvent{{Data: []string{"a"}}, {Data: []string{"b"}}}},
		{"only one space is dropped", "data:  a \n\n", []SSEEvent{{Data: []string{" a "}}}},
		{"multi-line data and other fields", ": ping\nevent: x\ndata: a\ndata: b\nid: 7\n\n",
			[]SSEEvent{{Data: []string{"a", "b"}, Other: []string{": ping", "event: x", "id: 7"}}}},
		{"comment only", ": ping\n\n", []SSEEvent{{Other: []string{": ping"}}}},
		{"cut before the blank line", "data: a\n\ndata: b", []SSEEvent{{Data: []string{"a"}}, {Data: []string{"b"}}}},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewSSEReader(strings.NewReader(tc.body))
			var got []SSEEvent
			for {
				ev, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ev)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("events %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSSEData(t *testing.T) {
	body := ": ping\n\ndata: {\"a\":1}\n\nevent: e\ndata: x\ndata: y\n\ndata: [DONE]\n\n"
	if got, want := SSEData([]byte(body)), []string{`{"a":1}`, "x\ny", "[DONE]"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("payloads %q, want %q", got, want)
	}
	if got := SSEData(nil); got != nil {
		t.Fatalf("payloads of an empty body %q", got)
	}
}

// TestSSEReaderError: a failing stream is an error, not a quiet end.
func TestSSEReaderError(t *testing.T) {
	boom := errors.New("boom")
	r := NewSSEReader(io.MultiReader(strings.NewReader("data: a\n\n"), iotest.ErrReader(boom)))
	if p, err := r.NextData(); err != nil || p != "a" {
		t.Fatalf("first event %q, %v", p, err)
	}
	if _, err := r.NextData(); !errors.Is(err, boom) {
		t.Fatalf("error %v, want %v", err, boom)
	}
}

// FuzzSSEReader: every event read back from a body written in canonical
// framing gives the same payloads, and no input panics. (A lone CR, which
// SSE counts as a line end and the reader does not, is left out.)
func FuzzSSEReader(f *testing.F) {
	f.Add("data: a\r\n\r\n: c\ndata:b\ndata: c\n\n")
	f.Add("data")
	f.Fuzz(func(t *testing.T, body string) {
		first := SSEData([]byte(body))
		var canon strings.Builder
		for _, p := range first {
			if strings.Contains(p, "\r") {
				t.Skip("lone CR")
			}
			for line := range strings.SplitSeq(p, "\n") {
				canon.WriteString("data: " + line + "\n")
			}
			canon.WriteString("\n")
		}
		if again := SSEData([]byte(canon.String())); !reflect.DeepEqual(again, first) {
			t.Fatalf("payloads %q, after a rewrite %q", first, again)
		}
	})
}

func TestFirstTokens(t *testing.T) {
	var f FirstTokens
	for _, name := range []string{"holder", "batch 1", "online", "batch 0"} {
		if err := f.Read(name, strings.NewReader("data: x\n\ndata: [DONE]\n\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Read("cut", strings.NewReader("")); !errors.Is(err, ErrNoSSEData) {
		t.Fatalf("an empty stream: %v", err)
	}
	for _, tc := range []struct {
		name, prefix string
		want         int
	}{
		{"online", "batch ", 1},
		{"batch 0", "batch ", 1},
		{"holder", "batch ", 0},
		{"online", "", 2},
		{"cut", "batch ", -1},
	} {
		if got := f.Before(tc.name, tc.prefix); got != tc.want {
			t.Errorf("Before(%q, %q) = %d, want %d", tc.name, tc.prefix, got, tc.want)
		}
	}
	if _, ok := f.At("online"); !ok {
		t.Error("no time for online")
	}
	if _, ok := f.At("cut"); ok {
		t.Error("a time for a stream without data")
	}
	if got := strings.Join(f.Order(), ","); got != "holder,batch 1,online,batch 0" {
		t.Errorf("order %s", got)
	}
}
