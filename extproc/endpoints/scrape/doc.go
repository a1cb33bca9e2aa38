// Package scrape keeps each endpoint's load metrics fresh: one loop per
// endpoint fetches the model server's Prometheus /metrics page, reads the
// few vLLM or SGLang series the picker routes on, publishes them as an
// immutable snapshot on the Endpoint, and moves endpoints whose scrapes keep
// failing out of the datastore's candidate set.
package scrape
