package precise

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestMultimodalPrefix: a chat prompt's image blocks hash with the image's
// multimodal hash, as the simulator's (and vLLM's) do: the same image
// matches, another image diverges from its first placeholder block on.
func TestMultimodalPrefix(t *testing.T) {
	dir := testutil.TokenizerDir(t)
	s := build(t, kvindex.New(kvindex.Config{}), fmt.Sprintf(`{"tokenizer": %q, "blockSize": 16, "hashSeed": "42"}`, dir))
	chat := func(url string) *scheduling.Request {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
			map[string]any{"type": "text", "text": "What is in this picture? Answer in one word."}}}}})
		r, err := openai.Parse(openai.ChatCompletions, body)
		if err != nil {
			t.Fatal(err)
		}
		return &scheduling.Request{TargetModel: r.Model, Body: r}
	}
	a, _ := s.Prefix(chat("http://img/a.png"), nil)
	a2, _ := s.Prefix(chat("http://img/a.png"), nil)
	b, _ := s.Prefix(chat("http://img/b.png"), nil)
	if a == nil || a2 == nil || b == nil {
		t.Fatal("no prefix")
	}
	if fmt.Sprint(a.Samples) != fmt.Sprint(a2.Samples) {
		t.Fatal("the same image hashed differently")
	}
	if fmt.Sprint(a.Samples) == fmt.Sprint(b.Samples) {
		t.Fatal("two images hashed the same: the multimodal hash is not in the block hashes")
	}
	// The scorer's hashes are the simulator's: TokensMM's placeholders,
	// the item's (identifier, offset) in exactly the blocks holding it.
	toks, mm, ok, err := s.multimodal(chat("http://img/a.png"))
	if !ok || err != nil || len(mm) != 1 || mm[0].Length != prompt.DefaultTokensPerItem {
		t.Fatalf("multimodal: %v %v %v", ok, mm, err)
	}
	h, _ := kvhash.New("42", 16)
	got := s.hashes(toks, kvhash.Extra{MM: mm})
	textOnly := h.AppendUint64s(nil, toks, kvhash.Extra{})
	first, last := mm[0].Offset/16, (mm[0].Offset+mm[0].Length-1)/16
	for i := range got {
		inItem := i >= first && i <= last
		if changed := got[i] != textOnly[i]; changed != (i >= first) {
			t.Fatalf("block %d (item blocks %d-%d, in item %v): changed %v", i, first, last, inItem, changed)
		}
	}
}
