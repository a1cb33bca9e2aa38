package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes a fresh self-signed pair for host into dir.
func writePair(t *testing.T, dir, host string) *x509.Certificate {
	t.Helper()
	c, err := SelfSigned(host)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	// Key first: a reader that sees the new certificate sees its key.
	if err := os.WriteFile(filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

// served dials a TLS listener using cfg and returns the certificate the
// server presented.
func served(t *testing.T, cfg *tls.Config) *x509.Certificate {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

func TestSelfSignedServes(t *testing.T) {
	cfg, err := ServerConfig(Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := served(t, cfg)
	if got.Subject.CommonName != "kvgate-epp" || got.NotAfter.Before(time.Now().AddDate(5, 0, 0)) {
		t.Errorf("self-signed cert = %s until %v", got.Subject, got.NotAfter)
	}
	// Verifiable against itself: a gateway that pins it can verify it.
	pool := x509.NewCertPool()
	pool.AddCert(got)
	if _, err := got.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost"}); err != nil {
		t.Errorf("self-signed cert does not verify against itself: %v", err)
	}
}

func TestDirReload(t *testing.T) {
	for _, reload := range []bool{false, true} {
		dir := t.TempDir()
		first := writePair(t, dir, "first.example")
		cfg, err := ServerConfig(Options{CertPath: dir, Reload: reload})
		if err != nil {
			t.Fatal(err)
		}
		if got := served(t, cfg); !got.Equal(first) {
			t.Fatalf("served %v, want the directory's certificate", got.DNSNames)
		}
		second := writePair(t, dir, "second.example")
		// A later modification time, whatever the file system's
		// resolution.
		later := time.Now().Add(2 * time.Second)
		for _, n := range []string{CertFile, KeyFile} {
			if err := os.Chtimes(filepath.Join(dir, n), later, later); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		var got *x509.Certificate
		for {
			got = served(t, cfg)
			if got.Equal(second) || time.Now().After(deadline) || !reload {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if reload && !got.Equal(second) {
			t.Errorf("reload on: still serving %v after the files changed", got.DNSNames)
		}
		if !reload && !got.Equal(first) {
			t.Errorf("reload off: serving %v, want the certificate read at start", got.DNSNames)
		}
	}
}

// A half-written rotation keeps the previous certificate.
func TestDirReloadBadPairKeepsOld(t *testing.T) {
	dir := t.TempDir()
	first := writePair(t, dir, "first.example")
	d, err := LoadDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	d.checkEvery = 0
	if err := os.WriteFile(filepath.Join(dir, CertFile), []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := d.Certificate(); !got.Leaf.Equal(first) {
		t.Errorf("a broken pair replaced the good one")
	}
	if d.LastError() == nil {
		t.Error("the failed reload is not reported")
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := ServerConfig(Options{CertPath: t.TempDir()}); err == nil {
		t.Error("a directory without tls.crt was accepted")
	}
	if _, err := ServerConfig(Options{Reload: true}); err == nil {
		t.Error("reload without --cert-path was accepted")
	}
	if _, err := Version("TLS1.2"); err == nil {
		t.Error("bad TLS version accepted")
	}
	if v, err := Version("VersionTLS13"); err != nil || v != tls.VersionTLS13 {
		t.Errorf("Version = %v, %v", v, err)
	}
	if _, err := CipherSuites([]string{"TLS_NOPE"}); err == nil {
		t.Error("bad cipher suite accepted")
	}
	if ids, err := CipherSuites([]string{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}); err != nil || len(ids) != 1 {
		t.Errorf("CipherSuites = %v, %v", ids, err)
	}
}
