#!/usr/bin/env bash
# Install valgrind (Debian package `valgrind`) if it is missing: bench/per_request.py --callgrind counts
# the gateway's instructions with callgrind, and tests/test_bench_smoke.py runs it. Idempotent.
set -euo pipefail
say() { echo "bench-deps: $*" >&2; }
if command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "valgrind is missing and this user cannot apt-get install it: bench/per_request.py --callgrind cannot run"
    exit 0
fi
DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 || say "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind </dev/null >&2
say "installed $(valgrind --version)"
