// Package chaos is kvgate's hostile-input and fault-injection run (`make
// chaos`, not part of `make test`): it starts a real fleet from the built
// binary (three simulators, the picker, the gateway with the wasm filter),
// throws hostile clients, killed and stopped processes, a slow and lossy
// network (simulators behind a delaylink: delayed packets, lost segments),
// killed node agents in a P/D fleet
// and a soak at it,
// and prints one line per check saying whether it held, with the memory
// and recovery figures measured. The bounded, per-finding regression tests
// live beside the code they cover; this is the long run.
//
// KVGATE_BIN names the kvgate binary (default bin/kvgate), so the same run
// can measure an older build for a before/after comparison.
package chaos
