package endpoints

import (
	"testing"
	"unsafe"
)

// TestEndpointLayout pins what Endpoint's doc promises: 256 bytes, so that
// endpoints start on a cache line (checked on allocated ones too), with
// what a decision reads of every candidate in the first two lines.
func TestEndpointLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("layout is tuned for 64-bit platforms")
	}
	var e Endpoint
	if got := unsafe.Sizeof(e); got != 256 {
		t.Errorf("Endpoint is %d bytes, want 256 (endpointSize)", got)
	}
	for i := range 64 {
		if a := uintptr(unsafe.Pointer(NewEndpoint(Spec{Name: "a"}))); a%64 != 0 {
			t.Fatalf("endpoint %d at %#x, not on a cache line", i, a)
		}
	}
	hot := map[string]uintptr{
		"load":             unsafe.Offsetof(e.load) + unsafe.Sizeof(e.load),
		"steps":            unsafe.Offsetof(e.steps) + unsafe.Sizeof(e.steps),
		"adapters":         unsafe.Offsetof(e.adapters) + unsafe.Sizeof(e.adapters),
		"metrics":          unsafe.Offsetof(e.metrics) + unsafe.Sizeof(e.metrics),
		"inflightRequests": unsafe.Offsetof(e.inflightRequests) + unsafe.Sizeof(e.inflightRequests),
		"inflightTokens":   unsafe.Offsetof(e.inflightTokens) + unsafe.Sizeof(e.inflightTokens),
	}
	for name, end := range hot {
		if end > 128 {
			t.Errorf("%s ends at byte %d, past the first two cache lines", name, end)
		}
	}
}

// TestListsAdapters: the flag follows every snapshot, so the adapter check
// that trusts it sees what the snapshot lists.
func TestListsAdapters(t *testing.T) {
	e := NewEndpoint(Spec{Name: "a", Address: "10.0.0.1:8000"})
	for _, tc := range []struct {
		name string
		m    Metrics
		want bool
	}{
		{"none", Metrics{}, false},
		{"empty sets", Metrics{ActiveLoRAs: map[string]struct{}{}, WaitingLoRAs: map[string]struct{}{}}, false},
		{"active", Metrics{ActiveLoRAs: map[string]struct{}{"sql": {}}}, true},
		{"waiting", Metrics{WaitingLoRAs: map[string]struct{}{"sql": {}}}, true},
		{"gone again", Metrics{ActiveLoRAs: map[string]struct{}{}}, false},
	} {
		m := tc.m
		e.SetMetrics(&m)
		if got := e.ListsAdapters(); got != tc.want {
			t.Errorf("%s: ListsAdapters = %v, want %v", tc.name, got, tc.want)
		}
	}
	if NewEndpoint(Spec{Name: "b"}).ListsAdapters() {
		t.Error("a new endpoint lists adapters")
	}
}
