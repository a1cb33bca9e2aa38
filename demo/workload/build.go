package workload

import (
	"math/rand/v2"
	"strings"
	"time"
)

// Options scale the trace down.
type Options struct {
	// WordsPerBlock is the text length of one 512-token trace block.
	WordsPerBlock int
	// MaxBlocks caps the blocks of one prompt (the longest trace prompts
	// have hundreds).
	MaxBlocks int
	// MaxOutputTokens caps max_tokens.
	MaxOutputTokens int
	// Duration is the span the arrivals are compressed into.
	Duration time.Duration
}

// DefaultOptions keep 200 requests cheap for four simulators on two cores.
func DefaultOptions() Options {
	return Options{WordsPerBlock: 64, MaxBlocks: 48, MaxOutputTokens: 32, Duration: 25 * time.Second}
}

// Request is one scaled request.
type Request struct {
	// At is the send time relative to the start of the replay.
	At        time.Duration
	Prompt    string
	MaxTokens int
	// Blocks is how many trace blocks the prompt holds.
	Blocks int
}

// Build scales entries into requests.
func Build(entries []Entry, o Options) []Request {
	if len(entries) == 0 {
		return nil
	}
	t0, t1 := entries[0].Timestamp, entries[len(entries)-1].Timestamp
	chunks := make(map[uint64]string) // bounded by the entries' blocks
	out := make([]Request, len(entries))
	for i, e := range entries {
		ids := e.HashIDs[:min(len(e.HashIDs), o.MaxBlocks)]
		var b strings.Builder
		for _, id := range ids {
			c, ok := chunks[id]
			if !ok {
				c = chunk(id, o.WordsPerBlock)
				chunks[id] = c
			}
			b.WriteString(c)
		}
		var at time.Duration
		if t1 > t0 {
			at = time.Duration(float64(e.Timestamp-t0) / float64(t1-t0) * float64(o.Duration))
		}
		out[i] = Request{At: at, Prompt: b.String(), MaxTokens: max(1, min(e.OutputLength, o.MaxOutputTokens)), Blocks: len(ids)}
	}
	return out
}

// chunk is the text of one block: words drawn by a generator seeded with
// the block id. Every word carries its leading space, so a chunk boundary
// is also a token boundary and shared chunks tokenize identically.
func chunk(id uint64, words int) string {
	r := rand.New(rand.NewPCG(id, 0x6b7667617465)) // "kvgate"
	var b strings.Builder
	for range words {
		b.WriteByte(' ')
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
	}
	return b.String()
}

// vocabulary are common English words, one Qwen3 token each with a
// leading space, so a chunk's token count is close to its word count.
var vocabulary = strings.Fields(`the of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there one all we their been has when who will more no
if out so said what up its about into than them can only other new some could time these two may then do
first any my now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very make
world still own see men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three house place small found
part water city light word open point large group order number river road music market garden window
paper table story morning summer winter energy system model cache block server request answer question`)

// Batch builds n requests of a synthetic offline job: distinct prompts of
// words words each (no two share a block, so the prefix cache cannot help
// them), maxTokens output tokens, arrivals spread evenly over span. seed
// keeps the prompts apart from the trace's blocks and from other jobs.
func Batch(n, words, maxTokens int, span time.Duration, seed uint64) []Request {
	out := make([]Request, n)
	for i := range out {
		var at time.Duration
		if n > 1 {
			at = time.Duration(float64(i) / float64(n-1) * float64(span))
		}
		out[i] = Request{At: at, Prompt: chunk(seed<<32|uint64(i), words), MaxTokens: max(1, maxTokens)}
	}
	return out
}
