// Command kvgate-agent is the node agent: KV-cache transfer between the
// model servers of a node and peer agents through NIXL over UCX, and the
// CPU tier. It is the one kvgate binary built with cgo (libucx-dev).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvgate/kvgate/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := agent.Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate-agent:", err)
		os.Exit(1)
	}
}
