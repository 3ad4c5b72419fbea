#!/usr/bin/env bash
# Install (only if missing or changed) a real JavaScript client used by the tests: the client's
# package.json + package-lock.json live in tests/clients/NAME/, node_modules next to them (git-ignored).
#
# Usage: scripts/node-clients.sh NAME    (e.g. codex, vercel-ai)
# Needs the machine's Node.js and npm and the npm registry; installs exactly what the lock file pins.
# Exit status: 0 installed; 3 Node.js/npm missing (the tests fail naming why); anything else a real failure.
set -euo pipefail

name="${1:?usage: node-clients.sh NAME}"
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/tests/clients/$name"
say() { echo "node-clients: $*" >&2; }

[ -f "$dir/package.json" ] || { say "no $dir/package.json"; exit 2; }
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    say "CANNOT INSTALL: Node.js and npm are needed for the $name client tests (apt-get install nodejs npm)"
    exit 3
fi

# The stamp records the lock file's hash: a changed lock reinstalls.
lock="$dir/package-lock.json"
want="$(sha256sum "$lock" 2>/dev/null | cut -d' ' -f1 || echo none)"
stamp="$dir/node_modules/.rg-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

cd "$dir"
if [ -f "$lock" ]; then
    say "installing $name (npm ci)"
    npm ci --no-audit --no-fund --loglevel=error >&2
else
    say "installing $name (npm install, writes package-lock.json)"
    npm install --no-audit --no-fund --loglevel=error >&2
    want="$(sha256sum "$lock" | cut -d' ' -f1)"
fi
echo "$want" >"$stamp"
