// Package flowpolicy holds the flow-control plugins of llm-d's router, as
// the `flowControl` section and the top-level `saturationDetector` refer to
// them: the fairness policies global-strict-fairness-policy,
// round-robin-fairness-policy and program-aware-fairness; the ordering
// policies fcfs-ordering-policy, edf-ordering-policy and
// slo-deadline-ordering-policy; the usage-limit policies
// static-usage-limit-policy, priority-holdback-policy and
// soft-reflective-ceiling-policy; and the saturation detectors
// utilization-detector and concurrency-detector (also scheduling filters).
// presence-holdback-policy is kvgate's own usage-limit policy: the
// sheddable bands' ceiling shrinks with the protected requests in flight,
// as a class-load-scorer (extproc/plugins/classload) counts them.
// decode-step-detector is kvgate's own saturation detector (also a scorer
// of sheddable requests): a server's predicted decode step from its
// in-flight requests and tokens.
//
// Each type documents its parameters. The detectors read the picker's live
// load model (extproc/endpoints) rather than only the last scrape, so that
// a request dispatched a moment ago already counts.
package flowpolicy
