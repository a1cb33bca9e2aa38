package testutil

import (
	"errors"
	"strings"
	"testing"
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
