package director

import "testing"

func TestDestination(t *testing.T) {
	for _, tc := range []struct {
		addr string
		port int
		want string
	}{
		{"10.0.0.7:8001", 0, "10.0.0.7:8001"},
		{"10.0.0.7:8001", 8000, "10.0.0.7:8000"},
		{"[fd00::7]:8001", 8000, "[fd00::7]:8000"},
		{"no-port", 8000, "no-port"},
	} {
		if got := destination(tc.addr, tc.port); got != tc.want {
			t.Errorf("destination(%q, %d) = %q, want %q", tc.addr, tc.port, got, tc.want)
		}
	}
}
