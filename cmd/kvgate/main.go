// Command kvgate is the single binary of kvgate's pure-Go components: the
// Endpoint Picker, the model-server simulator, the local gateway, the demo
// fleet and the cluster benchmark. Each subcommand's flags are parsed by
// the package that implements it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"syscall"

	"github.com/kvgate/kvgate/batch"
	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/benchmarks"
	"github.com/kvgate/kvgate/demo"
	"github.com/kvgate/kvgate/extproc/epp"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// command runs one subcommand until ctx ends; every subcommand writes only
// to the stdout and stderr it is given.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"epp":     {"Endpoint Picker: the Envoy ext_proc server", epp.Main},
	"async":   {"async processor: Redis sorted-set queues drained through dispatch gates", async.Main},
	"sim":     {"vLLM-compatible model-server simulator", vllmserver.Main},
	"gateway": {"local Envoy stand-in: HTTP proxy, ext_proc client, proxy-wasm host", gateway.Main},
	"batch":   {"the OpenAI Batch API (files, batches) run through the gateway", batch.Main},
	"bench":   {"trace-driven cluster simulation with the real picker", benchmarks.Main},
	"up":      {"the demo: a local fleet, picker and gateway, a workload and a policy comparison", demo.Main},
	"version": {"print the version", version},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvgate: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "kvgate %s: %v\n", args[0], err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvgate <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'kvgate <command> -h' for a command's flags.")
}

func version(_ context.Context, _ []string, stdout, _ io.Writer) error {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	_, err := fmt.Fprintln(stdout, "kvgate", v)
	return err
}
