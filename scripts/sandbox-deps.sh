#!/usr/bin/env bash
# Install bubblewrap (Debian package `bubblewrap`), the sandbox the code_interpreter tool runs model-written
# code in, if it is missing. Idempotent. Without it the gateway still runs: it says at start-up that the
# tool is unavailable and refuses it with a 400 naming why; it never runs code outside the sandbox.
set -euo pipefail
say() { echo "sandbox-deps: $*" >&2; }
if command -v bwrap >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "bubblewrap is missing and this user cannot apt-get install it: the code_interpreter tests will fail"
    exit 0
fi
DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 || say "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap </dev/null >&2
say "installed $(bwrap --version)"
