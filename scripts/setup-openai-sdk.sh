#!/usr/bin/env bash
# Installs the official OpenAI SDK (npm `openai`) that the `kvgate batch`
# end-to-end tests drive, pinned, into .cache/npm-openai: a prefix of its
# own, since npm prunes what an install did not name (sharing .cache/npm
# with the tokenizer package would make each install undo the other).
# Idempotent: with the version in place it only checks.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/npm-pinned.sh"
# 6.x: the newest line whose package supports Node 20 (7.x needs Node 22).
npm_pinned openai 6.30.1 "$root/.cache/npm-openai"
