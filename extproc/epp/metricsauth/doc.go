// Package metricsauth guards the picker's /metrics with Kubernetes
// authentication and authorization, as --metrics-endpoint-auth does in the
// GIE and llm-d pickers: the scraper's bearer token is checked with a
// TokenReview, and the user it names must be allowed `get` on the
// non-resource URL being fetched by a SubjectAccessReview. The upstream
// charts grant that through a ClusterRole on /metrics and give Prometheus a
// service-account token Secret.
package metricsauth
