//go:build unix

package testutil

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusedAddr is a loopback TCP address that refuses connections for the
// rest of the test. A port chosen by listening and closing again is free
// for any process to take (and then answer); this one stays bound to a
// socket that never listens, so the kernel resets every connect to it and
// gives the port to no one else.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	// SOCK_CLOEXEC is not on every unix (darwin): close-on-exec is set
	// under ForkLock instead, as package net does there, so that no child
	// a test starts meanwhile inherits the socket.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		tb.Fatalf("socket: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("getsockname: %v", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		tb.Fatalf("getsockname: %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port))
}
