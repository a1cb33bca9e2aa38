// Package dcgm holds llm-d's DCGM data-layer pair. dcgm-data-source polls
// NVIDIA's DCGM Exporter beside each endpoint, GET
// <scheme>://<endpoint host>:<port><path> (default http, 9400, /metrics),
// every interval; dcgm-extractor, wired under it in
// dataLayer.sources[].extractors, reads the exporter's
// DCGM_FI_DEV_GPU_UTIL samples of the endpoint (those whose pod label
// names the endpoint's pod, or without a pod label), takes the busiest
// GPU and keeps it, scaled from 0-100 to [0, 1], as the endpoint's
// GPUUtilization attribute, which endpoint-attribute-filter and
// endpoint-attribute-scorer read with producer: dcgm-extractor. A page
// without a matching sample removes the attribute (the endpoint counts
// as missing it); a failed poll keeps the previous value, until
// poll.MaxFailedRounds (3) in a row have failed: then it is dropped too.
//
// With useNodeAddress the exporter is the node's (a DaemonSet): the page
// is fetched from the endpoint's node address (its pod's status.hostIP in
// Kubernetes, nodeAddress in an endpoints file; an endpoint without one
// has no value), and the pod labels pick the endpoint's GPUs among the
// node's.
//
// The parameters are documented on Source and Extractor.
package dcgm
