package epp

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/epp/tlscert"
	"github.com/kvgate/kvgate/extproc/kvevents"
)

// KVEventLimits are the KV-event intake's limits as flags; each maps to the
// kvevents.Config field of the same meaning (defaults: kvevents'
// Default* constants).
type KVEventLimits struct {
	MaxConns        int
	MaxMessageBytes int64
	// MemoryBudgetBytes bounds the bytes read and not yet applied (with
	// what decoding them allocates) over all publishers,
	// PublisherMemoryBytes one publisher's.
	MemoryBudgetBytes    int64
	PublisherMemoryBytes int64
	// PublisherRate (messages/s) and PublisherBytesPerSecond; negative for
	// no limit.
	PublisherRate           float64
	PublisherBytesPerSecond float64
	HandshakeTimeout        time.Duration
	// TrustedCIDRs is a comma list of networks whose peers may publish for
	// any endpoint, as loopback may.
	TrustedCIDRs string
	// TLSCertPath is a directory with tls.crt and tls.key: the bound
	// KV-event socket then accepts only TLS. Empty for plain ZMTP (what
	// vLLM speaks).
	TLSCertPath string
	// DataParallelRanks is how many consecutive ports the bound KV-event
	// socket takes (kvevents.Config.BindRanks): vLLM's data-parallel rank
	// r connects its publisher to the configured port plus r.
	DataParallelRanks int
}

// maxDataParallelRanks bounds --kv-events-data-parallel-ranks: more ports
// than any data-parallel deployment has ranks per server is a typo.
const maxDataParallelRanks = 1024

func defaultKVEventLimits() KVEventLimits {
	return KVEventLimits{
		MaxConns:                kvevents.DefaultMaxConns,
		MaxMessageBytes:         kvevents.DefaultMaxMessageSize,
		MemoryBudgetBytes:       kvevents.DefaultMemoryBudget,
		PublisherMemoryBytes:    kvevents.DefaultPublisherMemory,
		PublisherRate:           kvevents.DefaultPublisherRate,
		PublisherBytesPerSecond: kvevents.DefaultPublisherBytes,
		HandshakeTimeout:        kvevents.DefaultHandshakeTimeout,
		DataParallelRanks:       1,
	}
}

func (l *KVEventLimits) flags(fs *flag.FlagSet) {
	fs.IntVar(&l.MaxConns, "kv-events-max-connections", l.MaxConns, "most open connections on --kv-events-addr")
	fs.Int64Var(&l.MaxMessageBytes, "kv-events-max-message-bytes", l.MaxMessageBytes, "largest KV-event message; a peer declaring more is disconnected before anything is allocated")
	fs.Int64Var(&l.MemoryBudgetBytes, "kv-events-memory-budget-bytes", l.MemoryBudgetBytes, "KV-event bytes read and not yet applied, with what decoding them allocates, all publishers together (plus 128 KiB per connection)")
	fs.Int64Var(&l.PublisherMemoryBytes, "kv-events-publisher-memory-bytes", l.PublisherMemoryBytes, "KV-event bytes one publisher may have read and not yet applied; beyond it the connection is closed")
	fs.Float64Var(&l.PublisherRate, "kv-events-publisher-rate", l.PublisherRate, "KV-event messages per second one publisher is read at, at most (<0: no limit)")
	fs.Float64Var(&l.PublisherBytesPerSecond, "kv-events-publisher-bytes-per-second", l.PublisherBytesPerSecond, "KV-event bytes per second one publisher is read at, at most (<0: no limit)")
	fs.DurationVar(&l.HandshakeTimeout, "kv-events-handshake-timeout", l.HandshakeTimeout, "longest ZMTP handshake of a KV-event connection")
	fs.StringVar(&l.TrustedCIDRs, "kv-events-trusted-cidrs", l.TrustedCIDRs, "comma list of networks (e.g. a relay's) whose peers may publish KV events for any endpoint; others only from a pool endpoint's own IP")
	fs.IntVar(&l.DataParallelRanks, "kv-events-data-parallel-ranks", l.DataParallelRanks, "ports --kv-events-addr binds, from its own on: vLLM's data-parallel rank r connects its publisher to the configured port + r, so set the ranks of a server (pod) that publishes to the picker; its connections then tell their rank")
	fs.StringVar(&l.TLSCertPath, "kv-events-tls-cert-path", l.TLSCertPath, "directory with tls.crt and tls.key: --kv-events-addr accepts only TLS (for TLS proxies in front of the servers; vLLM itself speaks plain ZMTP)")
}

// config checks l and fills the limits of a kvevents.Config (all but TLS,
// which tls reads from files).
func (l KVEventLimits) config(cfg *kvevents.Config) error {
	if l.MaxConns <= 0 || l.MaxMessageBytes <= 0 || l.MemoryBudgetBytes <= 0 || l.PublisherMemoryBytes <= 0 || l.HandshakeTimeout <= 0 {
		return errors.New("--kv-events-max-connections, --kv-events-max-message-bytes, --kv-events-memory-budget-bytes, --kv-events-publisher-memory-bytes and --kv-events-handshake-timeout must be positive")
	}
	if l.PublisherRate == 0 || l.PublisherBytesPerSecond == 0 {
		return errors.New("--kv-events-publisher-rate and --kv-events-publisher-bytes-per-second 0 would stop every publisher; use a negative value for no limit")
	}
	if l.MaxMessageBytes > l.PublisherMemoryBytes || l.PublisherMemoryBytes > l.MemoryBudgetBytes {
		return fmt.Errorf("--kv-events-max-message-bytes (%d) ≤ --kv-events-publisher-memory-bytes (%d) ≤ --kv-events-memory-budget-bytes (%d) must hold: one message must fit a publisher's share, and a share the budget",
			l.MaxMessageBytes, l.PublisherMemoryBytes, l.MemoryBudgetBytes)
	}
	if l.DataParallelRanks < 1 || l.DataParallelRanks > maxDataParallelRanks {
		return fmt.Errorf("--kv-events-data-parallel-ranks must be 1 to %d, got %d", maxDataParallelRanks, l.DataParallelRanks)
	}
	cfg.BindRanks = l.DataParallelRanks
	cfg.MaxConns, cfg.MaxMessageSize = l.MaxConns, l.MaxMessageBytes
	cfg.MemoryBudget, cfg.PublisherMemory = l.MemoryBudgetBytes, l.PublisherMemoryBytes
	cfg.PublisherRate, cfg.PublisherBytes = l.PublisherRate, l.PublisherBytesPerSecond
	cfg.HandshakeTimeout = l.HandshakeTimeout
	cfg.TrustedNets = nil
	for f := range strings.SplitSeq(l.TrustedCIDRs, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("--kv-events-trusted-cidrs: %w", err)
		}
		cfg.TrustedNets = append(cfg.TrustedNets, n.Masked())
	}
	return nil
}

// tls loads --kv-events-tls-cert-path; nil without it.
func (l KVEventLimits) tls() (*tls.Config, error) {
	if l.TLSCertPath == "" {
		return nil, nil
	}
	tc, err := tlscert.ServerConfig(tlscert.Options{CertPath: l.TLSCertPath})
	if err != nil {
		return nil, fmt.Errorf("--kv-events-tls-cert-path: %w", err)
	}
	return tc, nil
}
