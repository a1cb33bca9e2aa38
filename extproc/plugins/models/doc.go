// Package models holds llm-d's models data-layer pair. models-data-source
// polls each endpoint's OpenAI model list, GET
// <scheme>://<address><path> (default http, /v1/models), every interval;
// models-data-extractor, wired under it in dataLayer.sources[].extractors,
// keeps each endpoint's latest list (id, object, created, owned_by,
// parent: a LoRA adapter names its base model) as llm-d's ModelsAttribute.
// Plugins read it through Extractor.Models. As in llm-d no built-in
// scheduling plugin reads the attribute; a failed poll keeps the previous
// list and is logged, poll.MaxFailedRounds (3) failed polls in a row drop
// it, and an endpoint leaving the pool drops its list.
//
// The parameters are documented on Source and Extractor.
package models
