package epp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/epp/tlscert"
	"github.com/kvgate/kvgate/extproc/kvevents"
)

// writeCertDir writes a self-signed tls.crt / tls.key pair into a new
// directory.
func writeCertDir(t *testing.T) (string, *x509.Certificate) {
	t.Helper()
	c, err := tlscert.SelfSigned("localhost")
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, block := range map[string]*pem.Block{
		tlscert.CertFile: {Type: "CERTIFICATE", Bytes: c.Certificate[0]},
		tlscert.KeyFile:  {Type: "PRIVATE KEY", Bytes: key},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return dir, leaf
}

// The KV-event flags reach the subscriber's Config; without them it gets
// kvevents' defaults.
func TestKVEventFlagsReachConfig(t *testing.T) {
	certDir, leaf := writeCertDir(t)
	base := staticOptions(t)
	args := append(base.Args(),
		"--kv-events-max-connections", "7",
		"--kv-events-max-message-bytes", "65536",
		"--kv-events-memory-budget-bytes", "8388608",
		"--kv-events-publisher-memory-bytes", "1048576",
		"--kv-events-publisher-rate", "250",
		"--kv-events-publisher-bytes-per-second", "-1",
		"--kv-events-handshake-timeout", "750ms",
		"--kv-events-trusted-cidrs", "10.9.1.2/16, fd00:1::/64",
		"--kv-events-tls-cert-path", certDir,
		"--kv-events-data-parallel-ranks", "8",
	)
	o, err := ParseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(o, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := p.kvEventsConfig("tcp://127.0.0.1:0")
	if cfg.Bind != "tcp://127.0.0.1:0" || cfg.MaxConns != 7 || cfg.MaxMessageSize != 64<<10 || cfg.MemoryBudget != 8<<20 ||
		cfg.PublisherMemory != 1<<20 || cfg.PublisherRate != 250 || cfg.PublisherBytes != -1 || cfg.HandshakeTimeout != 750*time.Millisecond ||
		cfg.BindRanks != 8 {
		t.Errorf("limits not in the Config: %+v", cfg)
	}
	wantNets := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("fd00:1::/64")}
	if !reflect.DeepEqual(cfg.TrustedNets, wantNets) {
		t.Errorf("TrustedNets %v, want %v", cfg.TrustedNets, wantNets)
	}
	if cfg.TLS == nil {
		t.Fatal("--kv-events-tls-cert-path left the socket plaintext")
	}
	served, err := cfg.TLS.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || !bytes.Equal(served.Certificate[0], leaf.Raw) {
		t.Errorf("the KV-event socket serves another certificate (%v)", err)
	}

	// Without the flags: kvevents' defaults, no TLS, the plain pool rule.
	q, err := New(staticOptions(t), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	def := q.kvEventsConfig("")
	if def.MaxConns != kvevents.DefaultMaxConns || def.MaxMessageSize != kvevents.DefaultMaxMessageSize ||
		def.MemoryBudget != kvevents.DefaultMemoryBudget || def.PublisherMemory != kvevents.DefaultPublisherMemory ||
		def.PublisherRate != kvevents.DefaultPublisherRate || def.PublisherBytes != kvevents.DefaultPublisherBytes ||
		def.HandshakeTimeout != kvevents.DefaultHandshakeTimeout || def.TLS != nil || def.TrustedNets != nil || def.BindRanks != 1 {
		t.Errorf("defaults: %+v", def)
	}
}

// The bound socket runs with the flags: a picker started with
// --kv-events-tls-cert-path accepts a TLS connection on --kv-events-addr.
func TestKVEventTLSFlagServes(t *testing.T) {
	certDir, leaf := writeCertDir(t)
	o := staticOptions(t)
	o.KVEvents.TLSCertPath = certDir
	p, err := New(o, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-p.listening:
	case err := <-done:
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	conn, err := tls.Dial("tcp", p.KVEventsAddr().String(), &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("TLS to the KV-event socket: %v", err)
	}
	defer conn.Close()
	if got := conn.ConnectionState().PeerCertificates[0]; !got.Equal(leaf) {
		t.Error("the KV-event socket serves another certificate")
	}
}

func TestKVEventFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--kv-events-max-connections", "0"},
		{"--kv-events-max-message-bytes", "-1"},
		{"--kv-events-handshake-timeout", "0s"},
		{"--kv-events-publisher-rate", "0"},
		{"--kv-events-publisher-bytes-per-second", "0"},
		{"--kv-events-max-message-bytes", "2097152", "--kv-events-publisher-memory-bytes", "1048576"},
		{"--kv-events-publisher-memory-bytes", "1073741824", "--kv-events-memory-budget-bytes", "1048576"},
		{"--kv-events-trusted-cidrs", "10.0.0.0/33"},
		{"--kv-events-trusted-cidrs", "10.0.0.1"},
		{"--kv-events-data-parallel-ranks", "0"},
		{"--kv-events-data-parallel-ranks", "1025"},
	} {
		if _, err := ParseFlags(args, io.Discard); err == nil || !strings.Contains(err.Error(), "kv-events") {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
	o := staticOptions(t)
	o.KVEvents.TLSCertPath = t.TempDir()
	if _, err := New(o, quiet); err == nil || !strings.Contains(err.Error(), "--kv-events-tls-cert-path") {
		t.Errorf("an empty cert dir: %v", err)
	}
}
