//go:build !linux

package testutil

import "time"

// ThreadCPU is not measured outside Linux.
func ThreadCPU() (time.Duration, bool) { return 0, false }

// ThreadSwitches is not measured outside Linux.
func ThreadSwitches() (int64, bool) { return 0, false }
