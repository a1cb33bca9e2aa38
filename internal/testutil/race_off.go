//go:build !race

package testutil

// RaceEnabled reports a -race build; see race_on.go.
const RaceEnabled = false
