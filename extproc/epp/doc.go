// Package epp assembles the Endpoint Picker: it parses `kvgate epp` flags,
// builds the endpoint datastore and its discovery source, the metrics
// scraper, the scheduler from an EndpointPickerConfig, the director and the
// ext_proc server, and serves gRPC (ext_proc), gRPC health and Prometheus
// metrics until its context ends.
package epp
