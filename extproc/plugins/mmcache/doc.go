// Package mmcache holds llm-d's multimodal encoder-cache affinity pair.
// mm-embeddings-cache-producer remembers, per endpoint, the multimodal
// items (images, videos, audio) of the requests routed there, in an LRU
// sized like the server's encoder cache (cacheSizeInMBPerServer MiB at
// llm-d's assumed 2 MiB an item), and for each request says which of its
// items every candidate holds; mm-embeddings-cache-scorer scores a
// candidate by the share of the request's items it holds, so a request
// repeating an image goes where that image was encoded. An item is the
// xxhash64 of a chat part's image_url, video_url or audio_url URL, or of
// input_audio's data and format (or an Anthropic image block's URL or
// data); one item counts once per request. llm-d reads the hashes of
// the token producer's multimodal features; kvgate's token producers
// report none, so the parts themselves are hashed.
//
// The routed request's items go to the primary profile's targets. An
// endpoint leaving the pool drops its items. The producer is wired under
// endpoint-notification-source in dataLayer.sources, as llm-d's
// configuration does. llm-d's encoder_cache_* metrics are not exported.
//
// The parameters are documented on Producer and Scorer.
package mmcache
