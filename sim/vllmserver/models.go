package vllmserver

import (
	"net/http"
	"slices"
	"time"
)

// modelTable maps the model names clients may use to the base model or a
// LoRA adapter. It is immutable after New.
type modelTable struct {
	base    []string
	loras   map[string]LoRAModule
	order   []string       // adapter names in flag order
	loraIDs map[string]int // vLLM's lora_int_id: 1, 2, ... in flag order
	created int64
}

func newModelTable(base []string, loras []LoRAModule) modelTable {
	t := modelTable{base: slices.Clone(base), loras: make(map[string]LoRAModule),
		loraIDs: make(map[string]int), created: time.Now().Unix()}
	for i, l := range loras {
		t.loras[l.Name] = l
		t.order = append(t.order, l.Name)
		t.loraIDs[l.Name] = i + 1
	}
	return t
}

// resolve returns the adapter a model name selects ("" for the base
// model); ok is false for unknown names.
func (t *modelTable) resolve(name string) (lora string, ok bool) {
	if slices.Contains(t.base, name) {
		return "", true
	}
	if _, ok := t.loras[name]; ok {
		return name, true
	}
	return "", false
}

func (t *modelTable) names() []string { return append(slices.Clone(t.base), t.order...) }

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

// listModels is GET /v1/models: the served names, then the adapters with
// their base model as parent, as vLLM lists them.
func (s *Server) listModels(w http.ResponseWriter, _ *http.Request) {
	t := &s.models
	cards := make([]modelCard, 0, len(t.base)+len(t.order))
	for _, n := range t.base {
		cards = append(cards, modelCard{ID: n, Object: "model", Created: t.created, OwnedBy: "vllm",
			Root: s.opts.Model, MaxModelLen: s.engCfg.MaxModelLen})
	}
	parent := t.base[0]
	for _, n := range t.order {
		cards = append(cards, modelCard{ID: n, Object: "model", Created: t.created, OwnedBy: "vllm",
			Root: t.loras[n].Path, Parent: &parent})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": cards})
}
