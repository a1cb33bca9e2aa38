package engine

// MediumGPU is the medium of every block this engine stores: it models the
// GPU tier only, not vLLM's CPU offloading.
const MediumGPU = "GPU"

// Event is one KV-cache event, in vLLM's vocabulary: *BlockStored,
// *BlockRemoved or *AllBlocksCleared.
type Event interface{ kvEvent() }

// BlockStored announces consecutive blocks of one request that became full
// and entered the prefix cache in one scheduling decision.
type BlockStored struct {
	// BlockHashes are the event values (kvhash.Hash.Uint64) in order.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before the first one; only
	// meaningful when HasParent (vLLM sends null for a request's block 0).
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are the tokens of all the blocks, len = BlockSize × blocks.
	TokenIDs  []int
	BlockSize int
	LoRAName  string
	Medium    string
}

// BlockRemoved announces blocks evicted from the prefix cache; vLLM sends
// one hash per event.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      string
}

// AllBlocksCleared announces a reset of the whole prefix cache.
type AllBlocksCleared struct{}

func (*BlockStored) kvEvent()      {}
func (*BlockRemoved) kvEvent()     {}
func (*AllBlocksCleared) kvEvent() {}

// EventSink receives the KV-cache events of each step, in order, once per
// step that produced any. The engine calls it synchronously from Step (or
// ResetPrefixCache), that is at the step's start on the caller's clock;
// Runner calls it when the step's duration has elapsed instead. It must not
// block; the events are the sink's to keep, but the batch slice is reused
// after the call returns.
type EventSink interface {
	Publish(events []Event)
}
