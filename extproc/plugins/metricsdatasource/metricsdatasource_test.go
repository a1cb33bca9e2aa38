package metricsdatasource

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// writeCert writes a self-signed certificate and its key as PEM files.
func writeCert(t *testing.T) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvgate-test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

func TestParams(t *testing.T) {
	cert, key := writeCert(t)
	tests := []struct {
		name, params   string
		scheme, path   string
		skip, ca, mtls bool
		err            string
	}{
		{"defaults", `{}`, "http", "/metrics", true, false, false, ""},
		{"https verified with CA", `{"scheme":"https","path":"/m","insecureSkipVerify":false,"caCertPath":"` + cert + `"}`, "https", "/m", false, true, false, ""},
		{"mTLS", `{"scheme":"HTTPS","clientCertPath":"` + cert + `","clientKeyPath":"` + key + `"}`, "https", "/metrics", true, false, true, ""},
		{"bad scheme", `{"scheme":"ftp"}`, "", "", false, false, false, "parameters.scheme"},
		{"relative path", `{"path":"metrics"}`, "", "", false, false, false, "parameters.path"},
		{"missing CA", `{"caCertPath":"/nonexistent/ca.pem"}`, "", "", false, false, false, "parameters.caCertPath"},
		{"CA not PEM", `{"caCertPath":"` + key + `x"}`, "", "", false, false, false, "parameters.caCertPath"},
		{"cert without key", `{"clientCertPath":"` + cert + `"}`, "", "", false, false, false, "set together"},
		{"negative interval", `{"interval":"-1s"}`, "", "", false, false, false, "interval"},
		{"unknown", `{"port": 8000}`, "", "", false, false, false, "unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("", []byte(tc.params), &scheduling.Handle{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tg := p.(*Source).ScrapeTarget()
			if tg.Scheme != tc.scheme || tg.Path != tc.path || tg.TLS.InsecureSkipVerify != tc.skip || (tg.TLS.RootCAs != nil) != tc.ca || (len(tg.TLS.Certificates) == 1) != tc.mtls {
				t.Fatalf("target = %+v", tg)
			}
		})
	}
}

// The interval is a multiple of the base tick, as in llm-d.
func TestInterval(t *testing.T) {
	base := 50 * time.Millisecond
	for params, want := range map[string]time.Duration{
		`{}`:                   base,
		`{"interval": "1s"}`:   time.Second,
		`{"interval": "70ms"}`: 50 * time.Millisecond,
		`{"interval": "80ms"}`: 100 * time.Millisecond,
		`{"interval": "10ms"}`: 50 * time.Millisecond,
	} {
		p, err := New("", []byte(params), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.(*Source).ScrapeInterval(base); got != want {
			t.Errorf("%s: interval %v, want %v", params, got, want)
		}
	}
}
