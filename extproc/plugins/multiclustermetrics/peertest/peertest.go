// Package peertest runs fake peer clusters for the multi-cluster tests:
// each a loopback https server serving a cluster picker's pool averages,
// named in a multicluster-file-discovery file by a gateway DNS name with
// the server as its metricsAddress/metricsPort.
package peertest

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// Peer is one cluster: its name and pool averages.
type Peer struct {
	Name      string
	KV, Queue float64
}

// Gateway is the address the clusters file gives peer name.
func Gateway(name string) string { return "gateway." + name + ".example.com:443" }

// CAFile writes a PEM bundle trusting cert to a temporary file.
func CAFile(tb testing.TB, cert tls.Certificate) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Start serves peers (closed when tb ends) and returns the clusters file
// and the CA bundle that verifies them. namespace, when not empty, is
// every cluster's namespace.
func Start(tb testing.TB, namespace string, peers ...Peer) (clustersFile, caFile string) {
	tb.Helper()
	cert, _ := testutil.SelfSignedCert(tb)
	var b strings.Builder
	b.WriteString("endpoints:\n")
	for _, p := range peers {
		page := fmt.Sprintf("llm_d_epp_average_kv_cache_utilization{name=\"pool\"} %v\nllm_d_epp_average_queue_size{name=\"pool\"} %v\n", p.KV, p.Queue)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(page)) }))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
		tb.Cleanup(srv.Close)
		host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		gwHost, gwPort, _ := net.SplitHostPort(Gateway(p.Name))
		fmt.Fprintf(&b, "- name: %s\n  address: %s\n  port: %s\n  labels: {metricsAddress: %q, metricsPort: %q}\n", p.Name, gwHost, gwPort, host, port)
		if namespace != "" {
			fmt.Fprintf(&b, "  namespace: %s\n", namespace)
		}
	}
	clustersFile = filepath.Join(tb.TempDir(), "clusters.yaml")
	if err := os.WriteFile(clustersFile, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return clustersFile, CAFile(tb, cert)
}
