package eppwire

import (
	"strings"
	"testing"
)

func TestPrefersIfAvailable(t *testing.T) {
	for v, want := range map[string]bool{
		"":                              false,
		"if-available":                  true,
		"IF-Available":                  true,
		" respond-async , if-available": true,
		"if-available; x=1":             true,
		"wait=5, if-available;y":        true,
		"if-available-later":            false,
		"return=minimal":                false,
		"x=if-available":                false,
	} {
		if got := PrefersIfAvailable(v); got != want {
			t.Errorf("PrefersIfAvailable(%q) = %v, want %v", v, got, want)
		}
	}
}

func FuzzPrefersIfAvailable(f *testing.F) {
	f.Add("respond-async, if-available;x=1")
	f.Fuzz(func(t *testing.T, v string) {
		// A value without the token can never prefer it.
		if PrefersIfAvailable(v) && !strings.Contains(strings.ToLower(v), PreferIfAvailable) {
			t.Fatalf("%q", v)
		}
	})
}

func TestPickerOnly(t *testing.T) {
	for _, h := range PickerOnlyHeaders() {
		if !PickerOnly(h) {
			t.Errorf("%s listed but not picker-only", h)
		}
	}
	if PickerOnly(HeaderRequestID) || PickerOnly("X-Prefiller-Host-Port") {
		t.Error("picker-only names are the lower-case ones")
	}
}
