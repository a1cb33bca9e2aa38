// Package engine models a vLLM V1 engine as a deterministic state machine:
// continuous batching with chunked prefill, a paged KV cache with automatic
// prefix caching and LRU eviction, preemption by recomputation, vLLM's fcfs
// and priority scheduling policies, LoRA adapter slots, P/D disaggregation
// (prefill-only and remote-prefill requests) and the KV-cache events vLLM
// publishes, with each iteration's duration taken from a roofline model of a
// model on a GPU (see TIMING.md).
//
// One engine, two clocks: the Engine itself starts no goroutines and never
// reads real time. The caller adds requests, calls Step, and advances its own
// clock by the duration Step returns, so the same code serves the real-time
// HTTP simulator (through Runner, which sleeps out each step) and a
// discrete-event cluster benchmark (on a VirtualClock).
package engine
