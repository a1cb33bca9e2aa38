#!/usr/bin/env bash
# decision-instructions.sh OLD [NEW] [SIZES]: user-space instructions per
# headers-path ext_proc decision (BenchmarkDecisions, client in the same
# process), counted by callgrind in two trees, so that the host's load cannot
# move the figure the way it moves decisions/s.
#
# Each tree (NEW defaults to HEAD) is checked out into a temporary worktree
# whose benchmark gets the same two-line change: no metrics scrape after the
# first and a 1 h staleness threshold. Valgrind runs the process ~50× slower
# in wall time, so the real 50 ms scrape would add ~50× its per-decision work,
# and 200 ms-old metrics would mark the pool saturated. Callgrind dumps its
# counters at every testing.(*B).ResetTimer; the last part is the timed loop
# plus the fleet's teardown, and differencing N=101 against N=801 cancels the
# teardown. Start-up is in earlier parts, which is why whole-process totals
# (cachegrind) are not used: their start-up varies by ±150 M instructions.
set -euo pipefail
command -v valgrind >/dev/null || { echo "$0: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
old=${1:?usage: $0 OLD_COMMIT [NEW_COMMIT] [SIZES]}
new=${2:-HEAD}
sizes=${3:-1 16 220}
n1=101 n2=801
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'for t in old new; do git -C "$root" worktree remove --force "$work/$t" 2>/dev/null || true; done; rm -rf "$work"' EXIT

for t in old new; do
  rev=$old; [ $t = new ] && rev=$new
  git -C "$root" worktree add --detach --quiet "$work/$t" "$rev"
  f=$work/$t/extproc/epp/bench_test.go
  grep -q 'o.RefreshMetricsInterval = 50 \* time.Millisecond' "$f" || { echo "$t: BenchmarkDecisions setup changed; update this script" >&2; exit 1; }
  sed -i 's|o.RefreshMetricsInterval = 50 \* time.Millisecond|o.RefreshMetricsInterval = time.Hour; o.ConfigText = config.DefaultYAML + "saturationDetector:\\n  metricsStalenessThreshold: 1h\\n"|; s|^import (|import (\n\t"github.com/kvgate/kvgate/extproc/config"|' "$f"
  (cd "$work/$t" && go test -c -o "$work/$t.test" ./extproc/epp/)
done

# Async preemption's signals trip callgrind's signal bookkeeping. With
# adaptive starting stacks a new goroutine's first stack is whatever average
# the last GC scanned, so the stack copying per decision follows GC timing;
# fixed 2 KB stacks take that out. Goroutine interleaving still moves a run
# by about ±5 %: compare ratios from one invocation, and repeat it.
# envtest (the package's TestMain) is not needed.
export GODEBUG=asyncpreemptoff=1,adaptivestackstart=0 KUBEBUILDER_ASSETS=/nonexistent
export KVGATE_TOKENIZER_DIR=${KVGATE_TOKENIZER_DIR:-$root/.cache/tokenizers/qwen3}
loop() { # tree size n -> instructions of the last callgrind part
  local out=$work/clg.$1.$2.$3
  (cd "$work/$1/extproc/epp" && valgrind --tool=callgrind --dump-instr=no --dump-after='testing.(?B).ResetTimer' \
    --callgrind-out-file="$out" "$work/$1.test" -test.run '^$' \
    -test.bench "Decisions/path=headers/prompt=${2}KB\$" -test.benchtime "${3}x" -test.benchmem >"$out.log" 2>&1) ||
    { tail -20 "$out.log" >&2; exit 1; }
  awk '/^summary:/{print $2}' "$out"
}
printf '%-6s %14s %14s %8s\n' size old/decision new/decision new/old
for s in $sizes; do
  o1=$(loop old "$s" $n1); o2=$(loop old "$s" $n2)
  m1=$(loop new "$s" $n1); m2=$(loop new "$s" $n2)
  awk -v s="${s}KB" -v d=$((n2 - n1)) -v o=$((o2 - o1)) -v n=$((m2 - m1)) \
    'BEGIN { printf "%-6s %14d %14d %8.3f\n", s, o / d, n / d, n / o }'
done
