// Package cliflagtest checks that a component's Options survive the trip
// through the command line its Args method writes.
package cliflagtest

import (
	"reflect"
	"testing"
)

// RoundTrip fails t unless parse(args(o)) == o for each o.
func RoundTrip[O any](t testing.TB, parse func([]string) (O, error), args func(O) []string, opts ...O) {
	t.Helper()
	for _, o := range opts {
		got, err := parse(args(o))
		if err != nil {
			t.Fatalf("parse(%q): %v", args(o), err)
		}
		if !reflect.DeepEqual(got, o) {
			t.Fatalf("parse(%q) =\n%+v, want\n%+v", args(o), got, o)
		}
	}
}

// AllSet fails t for each field of the struct o left at its zero value,
// except those named: the options a round trip starts from must set every
// flag, so that a new flag Args forgets fails the test.
func AllSet(t testing.TB, o any, except ...string) {
	t.Helper()
	skip := make(map[string]bool, len(except))
	for _, e := range except {
		skip[e] = true
	}
	v := reflect.ValueOf(o)
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; !skip[name] && v.Field(i).IsZero() {
			t.Errorf("field %s not set in the round-trip options", name)
		}
	}
}
