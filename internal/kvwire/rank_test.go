package kvwire

import "testing"

func TestOffsetPort(t *testing.T) {
	tests := []struct {
		endpoint string
		rank     int
		want     string
		ok       bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", true},
		{"tcp://*:5557", 2, "tcp://*:5559", true},
		{"tcp://10.0.0.9:5557", 9, "tcp://10.0.0.9:5566", true},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", true},
		{"", 3, "", true},
		{"tcp://*:*", 0, "tcp://*:*", true},
		{"tcp://*:*", 1, "", false},
		{"tcp://*:0", 1, "", false},
		{"tcp://*:65535", 1, "", false},
		{"ipc:///tmp/kv", 1, "", false},
		{"tcp://*:5557", -1, "", false},
	}
	for _, tt := range tests {
		got, err := OffsetPort(tt.endpoint, tt.rank)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("OffsetPort(%q, %d) = %q, %v; want %q, ok %v", tt.endpoint, tt.rank, got, err, tt.want, tt.ok)
		}
	}
}
