//go:build unix

package testutil

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// The address refuses connections, and no one else can listen on it.
func TestRefusedAddr(t *testing.T) {
	addr := RefusedAddr(t)
	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("listen on %s succeeded; the port should stay held", addr)
	}
}
