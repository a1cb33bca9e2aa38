// Package kvindex maps vLLM KV-cache block hashes to the endpoints that hold
// them and in which tier (GPU memory or CPU offload), fed by KV events and
// read by the precise prefix scorer.
//
// The index is a bounded mirror of the model servers' caches: in steady
// state their BlockRemoved events keep it small, and the bound with its
// CLOCK eviction only matters when removals were lost. Size MaxEntries above
// the cluster's total cached blocks (sum of num_gpu_blocks plus offload
// blocks over all endpoints) so that eviction never drops a block a server
// holds.
//
// Copies: vLLM's block pool may hold several blocks with one hash (requests
// that computed it at once) and sends a BlockStored for each and a
// BlockRemoved for each eviction, so the index counts an endpoint's copies
// of a block per tier and forgets the block with the last one. Copies are
// counted for at most 1/16 of a shard's entry bound; past that a block goes
// at its first removal, as it did before copies were counted.
//
// Concurrency: the index is split into shards by block hash, each with one
// RWMutex. A write (Add, Remove, an eviction) holds one shard exclusively
// for one block; ClearEndpoint's sweep holds each shard for one pass over
// it. A lookup first reads block 0 under its shard's read lock alone (no
// candidate holding it ends the lookup there), then takes the read locks
// of every shard the prompt's blocks fall in, in shard order, for the rest
// of its walk: one lock round trip per block would cost more than the
// walk itself. Writers therefore wait for at most the lookups in flight,
// and taking the locks in one order keeps lookups from deadlocking one
// another. A lookup also holds the endpoint ids' lock shared for its walk,
// so ClearEndpoint cannot recycle a candidate's id to another endpoint
// mid-walk.
//
// Candidates: a lookup maps the entries of the blocks it walks to
// candidate positions by endpoint id, so with candidates resolved once
// (Resolve, reused while Current) it costs what the blocks' holders cost,
// not a map lookup per candidate.
//
// Memory: each shard is one open-addressing table of 16-byte block records
// holding up to three (endpoint, tiers) entries inline; blocks shared by
// more endpoints spill the rest into a per-shard map. A lookup reads one
// record per block, usually one cache line. See TestMemoryPerEntry for the
// bytes per entry.
package kvindex
