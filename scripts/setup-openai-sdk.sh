#!/usr/bin/env bash
# Installs the official OpenAI SDK (npm `openai`) that the `kvgate batch`
# end-to-end tests drive, pinned, into .cache/npm-openai. A prefix of its
# own: npm prunes packages a prefix's install did not name, so sharing
# .cache/npm with the tokenizer package would make each install undo the
# other. Idempotent: a second run with the version in place does nothing.
set -euo pipefail

pkg="openai"
# 6.x: the newest line whose package supports Node 20 (7.x needs Node 22).
version="6.30.1"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
npm_prefix="$root/.cache/npm-openai"
pkg_dir="$npm_prefix/node_modules/$pkg"

installed_version() {
	[ -f "$pkg_dir/package.json" ] || return 0
	sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pkg_dir/package.json" | head -n1
}

if [ "$(installed_version)" != "$version" ]; then
	echo "setup-openai-sdk: installing $pkg@$version into $npm_prefix" >&2
	mkdir -p "$npm_prefix"
	npm install --no-save --no-audit --no-fund --loglevel=error \
		--prefix "$npm_prefix" "$pkg@$version" >&2
fi
[ "$(installed_version)" = "$version" ] || { echo "setup-openai-sdk: $pkg@$version missing after install" >&2; exit 1; }
