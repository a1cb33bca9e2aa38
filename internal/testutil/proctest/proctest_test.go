package proctest

import "testing"

// ListeningOn takes the bound address from the exporter toolkit's line as
// Prometheus (logfmt) and kube-state-metrics (klog) print it, and not from
// the line naming the configured address.
func TestListeningOn(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`ts=2026-12-02T00:29:11.921Z caller=tls_config.go:232 level=info component=web msg="Listening on" address=127.0.0.1:38073`, "127.0.0.1:38073"},
		{`I1202 00:29:24.834327   26459 tls_config.go:354] "Listening on" address="127.0.0.1:41001"`, "127.0.0.1:41001"},
		{`I1202 00:29:24.834327   26459 tls_config.go:354] "Listening on" address="[::]:8080"`, "[::]:8080"},
		{`ts=2026-12-02T00:29:11.911Z caller=web.go:503 level=info component=web msg="Start listening for connections" address=127.0.0.1:0`, ""},
		{`level=info msg="Listening on systemd activated listeners instead of port listeners."`, ""},
	} {
		var got string
		if m := ListeningOn.FindStringSubmatch(c.line); m != nil {
			got = m[1]
		}
		if got != c.want {
			t.Errorf("%s: got %q, want %q", c.line, got, c.want)
		}
	}
}
