#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are missing,
# then downloads the Go modules. Idempotent: a second run installs nothing.
set -euo pipefail
missing=()
for p in "$@"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node may come from outside Debian (the machine image ships one); then the
# nodejs/npm packages are not needed.
if command -v node >/dev/null && command -v npm >/dev/null; then
	keep=()
	for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || keep+=("$p"); done
	missing=("${keep[@]}")
fi
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
go mod download
