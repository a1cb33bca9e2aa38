// Package kvevents is the picker's subscriber to model servers' KV-cache
// events: it receives vLLM's ZMQ event stream, keeps each endpoint's
// batches in order, recovers from lost messages and publisher restarts, and
// applies the events to a kvindex.Index.
//
// Two ways in, usable together:
//   - a central SUB socket the picker binds (Config.Bind, e.g. tcp://*:5557)
//     that servers connect to; the topic kv@<ip:port>@<model> names the
//     endpoint;
//   - a SUB socket per endpoint that the picker connects to (the endpoints
//     file's kvEvents: tcp://10.0.0.5:5557), where the endpoint is known
//     from configuration and the topic is ignored.
//
// Ownership: socket reader goroutines only parse frames and hand each
// message to the worker owning its endpoint (a fixed hash of the endpoint
// over Config.Workers bounded queues). A worker alone keeps its endpoints'
// sequence state and writes their entries to the index, so each endpoint's
// events apply in order. When a worker's queue is full the newest message
// is dropped and counted; the worker then sees a sequence gap and recovers
// as from any loss, so a slow worker costs accuracy, never memory.
//
// Peers: the sockets are kvgate's own ZMTP (internal/zmtp), which bounds
// what any peer can cost: a message size cap checked before allocation,
// handshakes off the accept loop under a deadline, a connection cap, a
// memory budget for messages read but not yet applied and for what
// decoding them allocates (global, per connection, with a small floor each
// connection always has), a per connection rate limit that slows a fast
// publisher down instead of queueing its excess, and optional TLS. The central socket admits only
// peers with the IP of a pool endpoint (or loopback), and a connection may
// publish only for endpoints with its own IP (Config.TrustedNets adds
// networks trusted as loopback is; Config.Authorize replaces the rule).
//
// Streams: an endpoint's stream is tied to the connection it arrives on,
// since only that is hard to forge. While it is open, another connection
// claiming the endpoint is ignored; a sequence number going back on it
// closes it (no publisher does that). Once it has ended, the next
// connection starts a new stream, and what its first sequence number
// claims is checked before it can clear anything: with a replay socket
// (an address from the pool's configuration) the publisher still holding
// the last batch applied, byte for byte, is a reconnect whose gap is
// filled; otherwise it restarted, the endpoint is cleared and rebuilt from
// the new publisher's start, even when its numbering has already passed
// the old one's (a slow-joiner jump). Without a replay socket a jump or a
// restart on a new connection clears the endpoint, as the old entries can
// no longer be trusted.
//
// Data-parallel ranks: vLLM runs a publisher per rank (each on its own
// port, the configured one plus the rank, all with one topic) and tags
// each batch with its rank, global across the deployment's nodes, while
// an endpoint's Source.Rank is its place in its server. The server's first
// rank is learned from connections whose rank is known (an endpoint's own
// socket, a port of a multi-port central bind, Config.BindRanks); a batch
// arriving for an endpoint that is one rank of a server (Source.Server)
// but tagged with another rank is routed, before anything else, to that
// rank's endpoint on the same IP when the pool has one, so each rank's
// batches form a stream of their own on its endpoint. Tags that fit no
// endpoint, or contradict the first rank learned, are counted and logged
// once per server.
//
// Recovery: a gap in an endpoint's sequence numbers on its connection is
// filled from the publisher's replay socket when one is configured for the
// endpoint (vLLM's ROUTER protocol); otherwise, or when the replay cannot
// cover the gap, the endpoint's entries are cleared and rebuilt from new
// events. The first message seen from an endpoint may have any sequence
// number: ZMQ's slow joiner loses the first messages after a connect, and
// a restarted picker joins mid-stream. What came before is then unknown
// rather than wrong, and is not replayed: a long-running publisher's
// buffer would take longer to replay than it is worth.
package kvevents
