package kvwire

import (
	"fmt"
	"strconv"
	"strings"
)

// OffsetPort is the endpoint data-parallel rank rank of a vLLM server uses
// for a configured endpoint: vLLM runs a publisher per rank and moves each
// off the configured port by the rank (ZmqEventPublisher.
// offset_endpoint_port), tcp://*:5557 being rank 2's tcp://*:5559, for its
// PUB socket (bound or connected) and its replay socket alike. The rank
// is vLLM's data_parallel_index, global across a deployment's nodes, not
// the rank's place in its pod. Rank 0 keeps the endpoint as it is; an
// endpoint with no numeric port, or a port moved beyond 65535, is an
// error (vLLM would fail the same way).
func OffsetPort(endpoint string, rank int) (string, error) {
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	if rank < 0 {
		return "", fmt.Errorf("kvwire: data-parallel rank %d is negative", rank)
	}
	i := strings.LastIndexByte(endpoint, ':')
	if !strings.HasPrefix(endpoint, "tcp://") || i < 0 {
		return "", fmt.Errorf("kvwire: endpoint %q has no port to offset by data-parallel rank %d", endpoint, rank)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port <= 0 || port+rank > 65535 {
		return "", fmt.Errorf("kvwire: endpoint %q: port cannot be offset by data-parallel rank %d", endpoint, rank)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}
