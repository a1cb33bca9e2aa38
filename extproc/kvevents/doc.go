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
// Recovery: a gap in an endpoint's sequence numbers is filled from the
// publisher's replay socket when one is configured for the endpoint (vLLM's
// ROUTER protocol); otherwise, or when the replay cannot cover the gap, the
// endpoint's entries are cleared and rebuilt from new events. A sequence
// number that goes backwards means the publisher restarted (with an empty
// cache): the endpoint is cleared, and what the new publisher sent before
// the message in hand is replayed when it can be. The first message seen
// from an endpoint may have any sequence number: ZMQ's slow joiner loses
// the first messages after a connect, and a restarted picker joins
// mid-stream. What came before is then unknown rather than wrong, and is
// not replayed: a long-running publisher's buffer would take longer to
// replay than it is worth.
package kvevents
