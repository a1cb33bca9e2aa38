// Package kvwire is vLLM's KV-cache event stream: the msgpack wire format
// of event batches in both of vLLM's encodings (array-like structs, and the
// map form newer vLLM emits), llm-d's kv@<ip:port>@<model> topic
// convention, and a ZMQ publisher with vLLM's framing and replay protocol,
// used by kvgate's simulator. The picker's subscriber lives in
// extproc/kvevents; both sides take the format from here.
//
// Wire format (as vLLM's ZmqEventPublisher in vllm/distributed/kv_events.py
// sends it): a ZMQ PUB message has three frames, the topic, an 8-byte
// big-endian sequence number counting from 0 per publisher, and the msgpack
// payload, an EventBatch. Decoding accepts either encoding for the envelope
// and for each event independently, tolerates missing or extra trailing
// array fields, and skips (and counts) events of unknown type.
package kvwire
