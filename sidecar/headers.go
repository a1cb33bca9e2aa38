package sidecar

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// routingHeaders are the picker's P/D headers the sidecar consumes, each
// with its two spellings in the order their values are trusted: the older
// name first, as llm-d's sidecar does, because every picker strips a
// client's copy of that one while a picker older than the rename forwards
// a client's x-llm-d-… value untouched. Both spellings are removed before
// any leg is sent, so no model server ever sees them.
var (
	prefillerHeaders = []string{eppwire.HeaderPrefiller, eppwire.HeaderPrefillerLLMD}
	encoderHeaders   = []string{eppwire.HeaderEncoders, eppwire.HeaderEncodersLLMD}
	kvSourceHeaders  = []string{eppwire.HeaderKVCacheSource, eppwire.HeaderKVCacheSourceLLMD}
)

// idempotencyHeaders mark a request its client allows to be sent twice
// (net/http's Transport reads the same two, canonical spellings): the
// stale-connection replay of a request already written whole needs one.
var idempotencyHeaders = []string{"Idempotency-Key", "X-Idempotency-Key"}

// maxHostList bounds how many host:port entries one header value may list;
// a pool's encoders are a handful, and every entry costs a check.
const maxHostList = 64

// takeHeader returns the values of the first spelling that has any and
// deletes every spelling from h.
func takeHeader(h http.Header, spellings []string) []string {
	var vals []string
	for _, n := range spellings {
		if len(vals) == 0 {
			vals = h.Values(n)
		}
	}
	for _, n := range spellings {
		h.Del(n)
	}
	return vals
}

// splitHosts flattens header values that each hold a comma list into
// trimmed, non-empty entries.
func splitHosts(vals []string) ([]string, error) {
	var out []string
	for _, v := range vals {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			if len(out) == maxHostList {
				return nil, fmt.Errorf("more than %d entries", maxHostList)
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// parseHostPort reads one header entry: ip:port or host:port, with an
// optional http:// prefix (llm-d's sidecar strips it for old pickers that
// sent URLs). The result is normalised: an IP is in its canonical form so
// that it compares equal to the pool's addresses.
func parseHostPort(s string) (string, error) {
	s = strings.TrimPrefix(s, "http://")
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("%q: want host:port", s)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%q: port out of range", s)
	}
	if host == "" || strings.ContainsAny(host, "/?#@ ") {
		return "", fmt.Errorf("%q: bad host", s)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(ip.Unmap(), uint16(p)).String(), nil
	}
	return net.JoinHostPort(strings.ToLower(host), strconv.Itoa(p)), nil
}
