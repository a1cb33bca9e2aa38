#!/usr/bin/env bash
# make bench-transfer: nixl-cgo's 64 MiB READ/WRITE benchmark and
# ucx_perftest's ucp_get/ucp_put_bw (UCX 1.13's name of the put bandwidth test)
# for the same size, over the same transport,
# in one run, with the ratio. Both report MB/s of 2^20 bytes.
#   UCX_TLS (default tcp), UCX_NET_DEVICES (default lo), ITERS (default 30)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
iters="${ITERS:-30}"
size=$((64 << 20))
command -v ucx_perftest >/dev/null || { echo "bench-transfer: ucx_perftest missing (Debian ucx-utils)" >&2; exit 1; }

perftest() { # $1 = ucp_get | ucp_put_bw; prints the overall MB/s of the Final line
	local port log pid n=$iters w=3
	# UCX 1.13's ucp_put_bw moves 64 MiB over tcp at ~20 MB/s here: a few
	# iterations keep the run short.
	if [[ $1 == ucp_put_bw ]]; then n=3 w=1; fi
	port=$((20000 + RANDOM % 20000))
	log="$(mktemp)"
	ucx_perftest -p "$port" >"$log" 2>&1 &
	pid=$!
	sleep 0.3
	local out
	out="$(ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$size" -n "$n" -w "$w" 2>&1)" || { kill "$pid" 2>/dev/null; cat "$log" >&2; echo "$out" >&2; return 1; }
	wait "$pid" 2>/dev/null || true
	rm -f "$log"
	awk '/^Final:/ {print $(NF-2)}' <<<"$out"
}

gobench() { # $1 = READ | WRITE
	go test -run '^$' -bench "BenchmarkTransfer64MiB/$1\$" -benchtime "${iters}x" ./nixl-cgo |
		awk '/MB\/s/ {for (i = 1; i < NF; i++) if ($(i+1) == "MB/s") print $i}'
}

printf 'transport %s on %s, %d x 64 MiB\n' "$UCX_TLS" "$UCX_NET_DEVICES" "$iters"
printf '%-6s %14s %18s %7s\n' op nixl-cgo_MB/s ucx_perftest_MB/s ratio
for pair in READ:ucp_get WRITE:ucp_put_bw; do
	op=${pair%%:*} test=${pair#*:}
	# Interleaved, the better of two rounds each: the machine is shared.
	g1=$(gobench "$op"); p1=$(perftest "$test"); g2=$(gobench "$op"); p2=$(perftest "$test")
	g=$(awk -v a="$g1" -v b="$g2" 'BEGIN {print (a > b ? a : b)}')
	p=$(awk -v a="$p1" -v b="$p2" 'BEGIN {print (a > b ? a : b)}')
	printf '%-6s %14.1f %18.1f %6.1f%%   (rounds: nixl %s %s, perftest %s %s)\n' "$op" "$g" "$p" \
		"$(awk -v g="$g" -v p="$p" 'BEGIN {print 100 * g / p}')" "$g1" "$g2" "$p1" "$p2"
done
