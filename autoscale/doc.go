// Package autoscale is kvgate's model of how a fleet's size follows its
// serving signals, and the variant planner behind `kvgate plan`.
//
// It holds three things that the chart, the benchmark and the planner share:
//
//   - the Kubernetes HorizontalPodAutoscaler's arithmetic (autoscaling/v2:
//     per-metric desired counts with the 10% tolerance, stabilization
//     windows, Pods/Percent rate policies) in HPA, so that a policy
//     simulated on the virtual clock moves as the HPA that KEDA creates
//     would move it;
//   - the policies of llm-d's KEDA ScaledObjects (queue, saturation,
//     queue-guard with its scalingModifiers formula, token-aware, and the
//     SLO-saturation control law with its hysteresis band), written against
//     Signals: the values their PromQL reads from the picker's metrics; and
//     two baselines, a fixed fleet and GPU-utilisation scaling;
//   - the planner (Plan): the cheapest replica mix of accelerator variants
//     that meets latency SLOs at an offered load, checked on the simulated
//     fleet, with its result exported as the Workload Variant Autoscaler's
//     wva_* metrics.
//
// The ScaledObjects themselves live in the Helm chart (deploy/helm/kvgate,
// templates/autoscaling-*.yaml); the policies here use the same names,
// thresholds and behaviours, and the chart test checks that they agree.
package autoscale
