// Package burstprefix is llm-d's burst-prefix-cache-producer: it
// co-locates bursts of requests sharing a prompt (the n samples of an RL
// rollout step arriving at once, when every cache is still cold and the
// cache scorers see nothing) so that the shared prefix is prefilled once.
//
// Requests arriving within windowDurationMs wait for the window to close
// and are placed jointly. Each prompt is hashed in blocks of
// blockSizeTokens (the token producer's tokens when one ran, else the
// prompt text at 4 bytes a token, as the approximate prefix matcher
// hashes). Requests with the same whole prefix form a group; a group of
// two or more is always placed whole, a lone request only when
// minColocateBlocks > 0 and it shares that many leading blocks with
// another request of the window. Groups go first, then the sharing lone
// requests, longest prefix first; a unit prefers the replica already
// holding a unit that shares at least minColocateBlocks leading blocks
// with it, as long as that replica is below its fair share of the window,
// else the least loaded replica (load counted in requests, or with
// balanceBy tokens in prefix blocks, charging a replica only the blocks it
// does not hold yet; ties go to fewer running requests, then the lower
// address); maxPerReplica caps a group's samples per replica, the rest
// spilling to the next replica. The producer's match is the whole prompt
// on the assigned replica and nothing elsewhere, for prefix-cache-scorer
// with prefixMatchInfoProducerName; a request without a placement matches
// nowhere and is left to the other scorers. It is not a cache prediction,
// so the load model and the latency predictor do not read it.
//
// The window is at most 10 s, and every request waits for it: keep it
// small. A full window (maxBatchSize) or a request cancelled while it
// waits gets no placement.
//
// Parameters (llm-d's names and defaults):
//
//	windowDurationMs: int        batch window, 1-10000 (default 100)
//	maxPerReplica: int           a group's samples per replica, -1 for
//	                             unlimited (default -1)
//	blockSizeTokens: int         tokens per hashed block (default 64)
//	maxPrefixTokensToMatch: int  leading tokens hashed, 0 for 2048 blocks
//	                             (default 0); else at least blockSizeTokens
//	minColocateBlocks: int       shared leading blocks that place a lone
//	                             request and prefer a replica (default 0:
//	                             only identical groups, load-balanced)
//	maxBatchSize: int            requests one window holds, -1 for
//	                             unlimited (default 1000)
//	balanceBy: string            requests (default) or tokens
package burstprefix
