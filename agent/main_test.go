package agent

import (
	"context"
	"io"
	"strings"
	"testing"
)

func TestMainRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ucx-param", "turbo=1", "--listen", "127.0.0.1:0"}, `unknown UCX backend parameter "turbo"`},
		{[]string{"--ucx-param", "num_workers"}, "want key=value"},
		{[]string{"--cpu-bytes", "-1"}, "must not be negative"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--netobs-class", "kv"}, "want name=port"},
		{[]string{"--netobs-class", "a=80", "--netobs-class", "a=81", "--listen", "127.0.0.1:0"}, `flow class "a" given twice`},
		{[]string{"--netobs-max-flows", "1", "--listen", "127.0.0.1:0"}, "MaxFlows"},
		{[]string{"--metrics-addr", "256.0.0.1:1", "--listen", "127.0.0.1:0"}, "--metrics-addr"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := Main(context.Background(), tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
