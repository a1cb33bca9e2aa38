// Package endpoints holds the picker's view of the model-server fleet: the
// endpoint identities (from a static file or Kubernetes), the load metrics
// scraped from each server's /metrics, and the in-flight work the picker
// itself has routed to each one.
//
// Ownership: a Datastore owns its Endpoint values. Membership changes replace
// an immutable slice atomically, so readers (the scheduler, per request) never
// lock; per-endpoint metrics are swapped as whole immutable snapshots.
//
// Membership comes from a Source (package staticfile, or Kubernetes) through
// Datastore.Replace; whoever needs to follow it (the scrapers of package
// scrape, the KV-event index) subscribes a Listener. Package poolmetrics
// exports the pool's state to Prometheus.
package endpoints
