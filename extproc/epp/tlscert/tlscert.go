package tlscert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// File names inside a --cert-path directory, as in a kubernetes.io/tls
// Secret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// SelfSigned makes a fresh ECDSA P-256 certificate for the given host
// names, valid for ten years from now less an hour (clock skew).
func SelfSigned(hosts ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serial number: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"kvgate"}, CommonName: "kvgate-epp"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              hosts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("creating certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Dir serves the key pair of a directory. With Reload, each handshake
// checks the files' size and modification time (two stats, cached for
// CheckEvery) and loads a changed pair; a pair that fails to load (a
// rotation caught half-written) keeps the previous certificate in use.
type Dir struct {
	dir        string
	reload     bool
	checkEvery time.Duration

	mu        sync.Mutex
	cert      *tls.Certificate
	stamp     [2]fileStamp
	lastCheck time.Time
	loadErr   error
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// LoadDir reads dir/tls.crt and dir/tls.key; it fails when they do not
// form a key pair.
func LoadDir(dir string, reload bool) (*Dir, error) {
	d := &Dir{dir: dir, reload: reload, checkEvery: time.Second}
	st, err := d.stamps()
	if err != nil {
		return nil, err
	}
	c, err := d.load()
	if err != nil {
		return nil, err
	}
	d.cert, d.stamp, d.lastCheck = c, st, time.Now()
	return d, nil
}

func (d *Dir) stamps() ([2]fileStamp, error) {
	var st [2]fileStamp
	for i, n := range []string{CertFile, KeyFile} {
		fi, err := os.Stat(filepath.Join(d.dir, n))
		if err != nil {
			return st, fmt.Errorf("--cert-path: %w", err)
		}
		st[i] = fileStamp{fi.Size(), fi.ModTime()}
	}
	return st, nil
}

func (d *Dir) load() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(filepath.Join(d.dir, CertFile), filepath.Join(d.dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("--cert-path %s: %w", d.dir, err)
	}
	return &c, nil
}

// Certificate is the pair in use, reloaded first when Reload is on and the
// files changed.
func (d *Dir) Certificate() *tls.Certificate {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.reload || time.Since(d.lastCheck) < d.checkEvery {
		return d.cert
	}
	d.lastCheck = time.Now()
	st, err := d.stamps()
	if err != nil || st == d.stamp {
		return d.cert
	}
	c, err := d.load()
	if err != nil {
		d.loadErr = err
		return d.cert
	}
	d.cert, d.stamp, d.loadErr = c, st, nil
	return d.cert
}

// LastError is the most recent failed reload, nil after a good one.
func (d *Dir) LastError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.loadErr
}

// Options are the TLS settings of the serving port.
type Options struct {
	// CertPath is a directory with tls.crt and tls.key; empty for a
	// self-signed certificate.
	CertPath string
	// Reload re-reads CertPath's files when they change.
	Reload bool
	// MinVersion is a crypto/tls version (0: TLS 1.2).
	MinVersion uint16
	// CipherSuites, for TLS 1.2 and below; nil for Go's defaults.
	CipherSuites []uint16
}

// ServerConfig builds the tls.Config of the serving port. The gRPC
// transport negotiates h2 by ALPN itself.
func ServerConfig(o Options) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, CipherSuites: o.CipherSuites}
	if o.MinVersion != 0 {
		cfg.MinVersion = o.MinVersion
	}
	if o.CertPath == "" {
		if o.Reload {
			return nil, errors.New("--enable-cert-reload needs --cert-path")
		}
		c, err := SelfSigned("localhost")
		if err != nil {
			return nil, fmt.Errorf("self-signed certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
		return cfg, nil
	}
	d, err := LoadDir(o.CertPath, o.Reload)
	if err != nil {
		return nil, err
	}
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return d.Certificate(), nil }
	return cfg, nil
}

// Version parses a TLS version name as the upstream --tls-min-version
// takes it (VersionTLS12, VersionTLS13, ...).
func Version(name string) (uint16, error) {
	switch name {
	case "VersionTLS10":
		return tls.VersionTLS10, nil
	case "VersionTLS11":
		return tls.VersionTLS11, nil
	case "VersionTLS12":
		return tls.VersionTLS12, nil
	case "VersionTLS13":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("unknown TLS version %q (VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13)", name)
}

// CipherSuites parses Go crypto/tls cipher-suite names.
func CipherSuites(names []string) ([]uint16, error) {
	byName := map[string]uint16{}
	for _, cs := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		byName[cs.Name] = cs.ID
	}
	var ids []uint16
	for _, n := range names {
		id, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("unknown cipher suite %q", n)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
