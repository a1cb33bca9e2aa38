// Package endpointattribute holds llm-d's generic endpoint-attribute
// plugins, which route on one numeric attribute a data-layer extractor
// publishes per endpoint (dcgm-extractor's GPUUtilization):
// endpoint-attribute-filter keeps the endpoints whose value passes a
// threshold, endpoint-attribute-scorer scores them linearly by it. The
// producer parameter names the extractor (a configured plugin's name);
// llm-d's default, the core metrics extractor's custom metrics, is
// refused, as kvgate's core-metrics-extractor refuses customMetrics.
//
// The parameters are documented on Filter and Scorer.
package endpointattribute
