// Package leader runs active-passive leader election for
// --ha-enable-leader-election: replicas of one picker compete for a
// coordination.k8s.io Lease named as llm-d names it
// (epp-<namespace>-<pool>.llm-d.ai, in the pool's namespace), and only the
// holder reports itself ready, so the Service sends traffic to one
// replica while the others stand by with warm state.
package leader
