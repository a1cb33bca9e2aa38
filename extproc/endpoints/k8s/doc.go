// Package k8s discovers the pool's endpoints from Kubernetes: an
// InferencePool (inference.networking.k8s.io/v1) and the Pods its selector
// matches, or a plain label selector with fixed target ports when there is no
// pool. It also resolves InferenceObjective priorities
// (inference.networking.x-k8s.io/v1alpha2) for the director.
//
// Everything is watched through one namespace-scoped controller-runtime
// cache, so the picker needs only a namespaced Role (get/list/watch on pods,
// inferencepools and inferenceobjectives), never cluster-wide rights.
//
// Ownership: the cache's informers call event handlers that only raise a
// flag; a single goroutine started by Run owns rebuilding the membership and
// calling apply, so apply is never called concurrently with itself and
// always receives the complete set.
package k8s
