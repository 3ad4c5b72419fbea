#!/usr/bin/env bash
# Install (only if missing) and start PostgreSQL and Redis on loopback for the store tests.
#
# Idempotent: a second run finds both servers up and only prints the URLs again. Everything lives in
# one directory (RG_SERVICES_DIR, default /tmp/rg-services) so nothing touches a system cluster.
# Writes "$RG_SERVICES_DIR/env" with the two URLs as shell exports; the tests read that file.
# Exit status: 0 both up; 3 a server cannot be installed here (the tests skip, loudly, naming why);
# anything else is a real failure.
set -euo pipefail

DIR="${RG_SERVICES_DIR:-/tmp/rg-services}"
PG_PORT="${RG_PG_PORT:-54329}"
REDIS_PORT="${RG_REDIS_PORT:-63799}"
ENV_FILE="$DIR/env"
mkdir -p "$DIR"
chmod 755 "$DIR"

say() { echo "test-services: $*" >&2; }
cannot() {
    say "CANNOT INSTALL: $*"
    printf 'RG_TEST_SERVICES_ERROR=%q\n' "$*" >"$ENV_FILE"
    exit 3
}

apt_updated=0
apt_install() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        cannot "$1 is missing and this user cannot apt-get install it"
    fi
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 || cannot "apt-get update failed"
        apt_updated=1
    fi
    # Debian's postinst would start a system cluster/server; policy-rc.d 101 stops that.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" </dev/null >&2 || {
        [ "$created_policy" = 1 ] && rm -f "$policy"
        cannot "apt-get install $* failed"
    }
    [ "$created_policy" = 1 ] && rm -f "$policy"
    return 0
}

pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then dirname "$(command -v initdb)"; fi
}

# ------------------------------------------------------------------------------------ PostgreSQL
PGBIN=$(pg_bindir)
if [ -z "$PGBIN" ]; then
    apt_install postgresql
    PGBIN=$(pg_bindir)
    [ -n "$PGBIN" ] || cannot "postgresql installed but no initdb found"
fi

# initdb and postgres refuse to run as root: run them as the 'postgres' user when we are root.
PGUSER_OS=$(id -un)
as_pg() { "$@"; }
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$DIR" --shell /bin/sh postgres
    PGUSER_OS=postgres
    as_pg() { runuser -u postgres -- "$@"; }
fi

PGDATA="$DIR/pg"
PGSOCK="$DIR/pg-socket"
PGLOG="$DIR/pg-log/postgres.log"
mkdir -p "$PGDATA" "$PGSOCK" "$DIR/pg-log"
chown "$PGUSER_OS" "$PGDATA" "$PGSOCK" "$DIR/pg-log"
chmod 700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    say "initdb $PGDATA"
    as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >&2 </dev/null \
        || as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 --no-locale >&2 </dev/null
fi

if ! as_pg "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
    say "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    # A pid file left by a killed server would block the start; pg_ctl status said it is not running.
    rm -f "$PGDATA/postmaster.pid"
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGLOG" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PGSOCK -c fsync=off -c synchronous_commit=off -c max_connections=200" \
        start >&2 </dev/null || { tail -n 20 "$PGLOG" >&2; exit 1; }
fi
for _ in $(seq 1 60); do
    "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
    sleep 0.5
done
"$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || { say "PostgreSQL did not become ready"; exit 1; }
if ! "$PGBIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='rg_test'" postgres </dev/null | grep -q 1; then
    "$PGBIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "CREATE DATABASE rg_test" postgres </dev/null >&2
fi

# ------------------------------------------------------------------------------------ Redis
if ! command -v redis-server >/dev/null; then
    apt_install redis-server
    command -v redis-server >/dev/null || cannot "redis-server installed but not on PATH"
fi
mkdir -p "$DIR/redis"
if ! redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
    say "starting Redis on 127.0.0.1:$REDIS_PORT"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes --dir "$DIR/redis" \
        --pidfile "$DIR/redis/redis.pid" --logfile "$DIR/redis/redis.log" --save "" --appendonly no \
        </dev/null >&2
fi
for _ in $(seq 1 40); do
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
    sleep 0.25
done
redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG || { say "Redis did not answer"; exit 1; }

PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/rg_test"
REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
{
    echo "export RG_TEST_POSTGRES_URL=$PG_URL"
    echo "export RG_TEST_REDIS_URL=$REDIS_URL"
} >"$ENV_FILE"
echo "export RG_TEST_POSTGRES_URL=$PG_URL"
echo "export RG_TEST_REDIS_URL=$REDIS_URL"
