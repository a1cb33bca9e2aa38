// Package zmtp is kvgate's own implementation of ZMTP 3.x, the wire
// protocol of ZeroMQ, reduced to what vLLM's KV-event stream needs: the
// NULL security mechanism, PUB/SUB with subscriptions (both the ZMTP 3.0
// message form and the 3.1 SUBSCRIBE/CANCEL commands), multipart messages,
// and the DEALER/ROUTER pair of vLLM's replay protocol. It interoperates
// with libzmq (see libzmq_test.go).
//
// It exists because the picker's KV-event port faces the network: every
// peer is untrusted until proven otherwise, and no byte sequence may crash,
// wedge or bloat the process. Hence:
//   - frame sizes are checked against Limits before any allocation, and read
//     buffers grow only as bytes actually arrive, accounted to an Allocator
//     that can refuse them; an oversized declaration drops the connection
//     with ErrTooLarge;
//   - a Server handshakes each connection in its own goroutine under a
//     deadline, off the accept loop, after a caller-supplied admission check
//     on the remote address, and caps concurrent connections;
//   - a bound socket never dials; a connecting one (Redial) redials with a
//     bounded, jittered exponential backoff until its context ends;
//   - a Pub gives every subscriber a bounded send queue and a write
//     deadline: a subscriber that cannot keep up loses messages (counted),
//     one that stops reading is disconnected; Send never blocks;
//   - TLS is optional on both sides (a tls.Config wraps the TCP stream; ZMTP
//     runs unchanged inside).
//
// Ownership: a Conn's reads belong to one goroutine (the handler the Server
// or Redial gives it); writes are serialized by the Conn. Servers and Pubs
// close every connection they own on Close and wait for their goroutines.
package zmtp
