package vllmserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The dials whose host a request's kv_transfer_params name, as the
// refused-dial counter's "dial" label.
const (
	dialReleaseKV = "release_kv"     // a decode leg's POST /kvgate/release_kv to its prefiller
	dialNIXLPull  = "nixl_pull"      // --agent: a decode leg's pull from the prefiller's agent
	dialKVSource  = "kv_source_pull" // --agent: a remote_kv_source pull from a peer's CPU tier
	dialP2PPull   = "p2p_pull"       // OffloadingConnector: a remote_prefiller pull from its p2p tier
)

// errRefusedHost marks a host a request body names that this server will
// not dial.
var errRefusedHost = errors.New("not a host this simulator dials")

// allowList is --kv-allowed-hosts parsed: addresses, prefixes and names a
// request body may make this server dial besides loopback and localhost.
type allowList struct {
	addrs    map[netip.Addr]bool
	prefixes []netip.Prefix
	names    map[string]bool
}

// parseAllowList reads --kv-allowed-hosts entries: an IP address, a CIDR
// prefix or a host name each; anything else (a port, a URL) is refused by
// name rather than never matching.
func parseAllowList(entries []string) (allowList, error) {
	l := allowList{addrs: map[netip.Addr]bool{}, names: map[string]bool{}}
	for _, e := range entries {
		if a, err := netip.ParseAddr(e); err == nil {
			l.addrs[a.Unmap()] = true
			continue
		}
		if p, err := netip.ParsePrefix(e); err == nil {
			// Hosts are compared unmapped, so an IPv4 prefix in IPv6 form
			// is too.
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			l.prefixes = append(l.prefixes, p.Masked())
			continue
		}
		if !hostName(e) {
			return allowList{}, fmt.Errorf("--kv-allowed-hosts %q: want an IP address, a CIDR prefix or a host name", e)
		}
		l.names[strings.ToLower(e)] = true
	}
	return l, nil
}

// hostName reports whether s is a DNS name: dot-separated labels of
// letters, digits and inner hyphens.
func hostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
				return false
			}
		}
	}
	return true
}

// allows reports whether host may be dialled: a loopback address,
// localhost, or one of the list's.
func (l allowList) allows(host string) bool {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return strings.EqualFold(host, "localhost") || l.names[strings.ToLower(host)]
	}
	a = a.Unmap()
	if a.IsLoopback() || l.addrs[a] {
		return true
	}
	for _, p := range l.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerGuard is the one check every dial a request body names goes
// through, and the client of those that speak HTTP. A client that reaches
// this server could otherwise have it dial anywhere (a metadata service,
// a port on the host's network).
type peerGuard struct {
	allow   allowList
	log     *slog.Logger
	refused *prometheus.CounterVec // by dial
}

func newPeerGuard(allow allowList, log *slog.Logger, reg prometheus.Registerer) (*peerGuard, error) {
	g := &peerGuard{allow: allow, log: log, refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_sim_refused_dials_total",
		Help: "dials to a host a request's kv_transfer_params named that is not loopback, localhost or in --kv-allowed-hosts, refused before any connection",
	}, []string{"dial"})}
	for _, d := range []string{dialReleaseKV, dialNIXLPull, dialKVSource, dialP2PPull} {
		g.refused.WithLabelValues(d)
	}
	if err := reg.Register(g.refused); err != nil {
		return nil, err
	}
	return g, nil
}

// check returns nil when host may be dialled for dial; otherwise it logs,
// counts, and returns an error wrapping errRefusedHost that names field
// (the kv_transfer_params field that named the host) and the flag.
func (g *peerGuard) check(dial, field, host string) error {
	if g.allow.allows(host) {
		return nil
	}
	g.refused.WithLabelValues(dial).Inc()
	g.log.Warn("refused to dial a host a request named", "dial", dial, "field", field, "host", host)
	return fmt.Errorf("kv_transfer_params %s %q: %w (loopback, localhost and --kv-allowed-hosts only)", field, host, errRefusedHost)
}

// peerConnectTimeout bounds connecting to a peer, within the whole call's
// own bound.
const peerConnectTimeout = 5 * time.Second

// newPeerClient is the HTTP client of the dials a request body names: its
// own transport, so no proxy from the environment; a bounded connect; and
// no redirect, which would lead the call to a host never checked.
// timeout bounds each call whole.
func newPeerClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: peerConnectTimeout}).DialContext,
			ResponseHeaderTimeout: timeout, IdleConnTimeout: 90 * time.Second},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       timeout,
	}
}
