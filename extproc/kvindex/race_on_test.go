//go:build race

package kvindex

// raceEnabled skips measurements the race detector distorts.
const raceEnabled = true
