// Package delaylink joins two network namespaces by a veth pair and delays
// one direction in a Go TUN forwarder, for tests that need a link with a
// known RTT where netem is not available.
//
// Namespace A routes B's address into a TUN device; the forwarder reads each
// IPv4 packet there, holds it for Delay, and sends it out of A's veth end
// through a packet socket, so B receives it on its veth end as if A had
// sent it directly. B answers over the veth pair undelayed, so a flow's RTT
// is Delay plus the veth's few microseconds. DropEvery, when set, drops
// every Nth TCP segment that carries data (retransmits to count).
//
// It needs root (network namespaces, TUN); New skips the test otherwise.
// Everything it creates is removed when the test ends.
package delaylink
