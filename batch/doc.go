// Package batch is `kvgate batch`: the OpenAI Batch API (files, batches,
// their lifecycle) in front of a kvgate gateway, and the processor that
// runs each job's lines through it.
//
// Who owns what:
//   - Store (store.go) holds file and batch records, the job queue and the
//     processing leases. boltStore is the embedded default (one process,
//     bbolt under --data-dir); redisStore keeps them in Redis/Valkey in
//     llm-d's `llmd_batch:*` key layout so several replicas share them.
//   - Blobs (blobs.go) hold file contents on a filesystem (--data-dir; a
//     shared one in Redis mode).
//   - The processor (processor.go) owns a job while it holds its lease:
//     it validates the input file, dispatches the lines through a
//     Dispatcher (dispatch.go) grouped by model under global and per-model
//     limits, appends each result to the job's journal (journal.go), and at
//     the end writes the output and error files from the journal.
//
// Exactly once: a line's result exists once it is in the journal (fsync'd
// before it counts); a restarted processor replays the journal and
// dispatches only the lines without a result, and the output and error
// files are written from the journal with deterministic ids, so a crash at
// any point, finalisation included, repeats work but never a result.
package batch
