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
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := Main(context.Background(), tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
