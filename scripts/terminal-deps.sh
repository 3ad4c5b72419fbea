#!/usr/bin/env bash
# Install tmux (Debian package `tmux`) if it is missing: tests/test_chat_tmux.py drives
# `responses-gateway chat` in a real terminal through it (send keys, read the screen). Idempotent.
set -euo pipefail
say() { echo "terminal-deps: $*" >&2; }
if command -v tmux >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "tmux is missing and this user cannot apt-get install it: the terminal chat test will fail"
    exit 0
fi
DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 || say "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux </dev/null >&2
say "installed $(tmux -V)"
