#!/usr/bin/env bash
# `make test`'s last step: the whole suite on both builds, side by side: the interpreted source (the
# fallback) and the compiled hot path (PYTHONPATH=build/compiled/src, what `make run` serves).
#
# One after the other they took 28 min of CI's 45 on 2 cores, side by side 17 (docs/architecture.md,
# "Tests"): much of a run waits on servers and subprocesses. Each run has its own PostgreSQL and
# Redis (own directory and ports), so neither resets the other's databases.
# The servers and the JavaScript clients are installed first, one at a time: two apt-get or npm
# installs at once would collide. Every output line is prefixed with its build; the whole logs stay
# in build/test-logs/. With one core, or RG_TEST_SERIAL=1, the runs go one after the other.
# Arguments go to both pytest runs: `scripts/test-builds.sh tests/test_websocket.py -k sdk`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
logs=$root/build/test-logs
mkdir -p "$logs"

for dir in tests/clients/*/; do
    scripts/node-clients.sh "$(basename "$dir")" || {
        rc=$?
        # 3: Node.js or npm is missing; the client tests fail, naming why.
        [ "$rc" = 3 ] || exit "$rc"
    }
done

# Each build's PostgreSQL and Redis: directory, PostgreSQL port, Redis port.
declare -A services=(
    [interpreted]="/tmp/rg-services 54329 63799"
    [compiled]="/tmp/rg-services-compiled 54339 63809"
)
service_env() {
    local dir pg redis
    read -r dir pg redis <<<"${services[$1]}"
    echo "RG_SERVICES_DIR=$dir RG_PG_PORT=$pg RG_REDIS_PORT=$redis"
}
for name in interpreted compiled; do
    # shellcheck disable=SC2046
    env $(service_env "$name") bash scripts/test-services.sh >/dev/null || {
        rc=$?
        # 3: a server cannot be installed here; its tests skip loudly, naming why.
        [ "$rc" = 3 ] || { echo "scripts/test-services.sh failed for the $name run ($rc)"; exit "$rc"; }
    }
done

# The build's name, then any other VAR=value for its run (the script's arguments go to pytest).
run() {
    local name=$1
    shift
    # shellcheck disable=SC2046
    env $(service_env "$name") RG_TEST_BUILD="$name" "$@" \
        .venv/bin/python -m pytest -o cache_dir="$logs/cache-$name" "${pytest_args[@]}" 2>&1 \
        | tee "$logs/$name.log" | sed -u "s/^/[$name] /"
    return "${PIPESTATUS[0]}"
}
pytest_args=("$@")
compiled_path="$root/build/compiled/src${PYTHONPATH:+:$PYTHONPATH}"

if [ "${RG_TEST_SERIAL:-0}" = 1 ] || [ "$(nproc)" -lt 2 ]; then
    run interpreted; a=$?
    run compiled PYTHONPATH="$compiled_path"; b=$?
else
    run interpreted &
    interpreted=$!
    run compiled PYTHONPATH="$compiled_path" &
    compiled=$!
    wait "$interpreted"; a=$?
    wait "$compiled"; b=$?
fi
summary() { grep -E '(passed|failed|errors?|deselected|no tests ran).* in [0-9.]+s' "$logs/$1.log" | tail -n 1 | tr -d '='; }
echo "interpreted: $(summary interpreted) (exit $a)"
echo "compiled:    $(summary compiled) (exit $b)"
[ "$a" = 0 ] && [ "$b" = 0 ]
