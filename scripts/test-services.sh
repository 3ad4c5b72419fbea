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

# ------------------------------------------------------------------------------------ pgvector
# The vector search back end on PostgreSQL (docs/file-search.md). Bookworm ships no binary package,
# but Debian's archive serves the source (trixie's 0.8.0-1); it is built once against this server's
# pg_config and installed into its extension directory. The tarball's checksum is pinned (the .dsc's
# SHA-256, itself pinned); sources are cached under $DIR/pgvector. A failure here does not stop the
# servers: the gateway falls back to its in-memory index without pgvector, and the tests that need
# pgvector skip loudly, naming this reason (RG_TEST_PGVECTOR_ERROR in the env file).
PGVECTOR_VERSION=0.8.0
PGVECTOR_DSC_SHA256=a71780bf7ab9901094a3d9869c489b6e2bcb858a8c14a5fa52d159933e016308
PGVECTOR_ORIG_SHA256=867a2c328d4928a5a9d6f052cd3bc78c7d60228a9b914ad32aa3db88e9de27b0
PGVECTOR_POOL=https://deb.debian.org/debian/pool/main/p/pgvector
PGVECTOR_ERROR=""
pgvector_build() {
    local src="$DIR/pgvector" sharedir pkglibdir pgconfig="$PGBIN/pg_config"
    if [ ! -x "$pgconfig" ] || [ ! -f "$("$pgconfig" --includedir-server)/postgres.h" ]; then
        # In a subshell: apt_install's "cannot" must not end the script (PostgreSQL itself is up).
        (apt_install "postgresql-server-dev-$("$PGBIN/postgres" --version | sed -E 's/.* ([0-9]+)\..*/\1/')") \
            || { PGVECTOR_ERROR="cannot apt-get install postgresql-server-dev"; return 1; }
    fi
    [ -x "$pgconfig" ] || { PGVECTOR_ERROR="no pg_config for $PGBIN"; return 1; }
    sharedir=$("$pgconfig" --sharedir)
    pkglibdir=$("$pgconfig" --pkglibdir)
    if [ -f "$sharedir/extension/vector--$PGVECTOR_VERSION.sql" ] && [ -f "$pkglibdir/vector.so" ]; then
        return 0
    fi
    if ! command -v make >/dev/null || ! command -v gcc >/dev/null; then
        (apt_install build-essential) || { PGVECTOR_ERROR="cannot apt-get install build-essential"; return 1; }
    fi
    mkdir -p "$src"
    local dsc="$src/pgvector_$PGVECTOR_VERSION-1.dsc" orig="$src/pgvector_$PGVECTOR_VERSION.orig.tar.gz"
    if ! echo "$PGVECTOR_DSC_SHA256  $dsc" | sha256sum -c --status 2>/dev/null; then
        curl -fsSL --retry 3 -o "$dsc" "$PGVECTOR_POOL/pgvector_$PGVECTOR_VERSION-1.dsc" \
            || { PGVECTOR_ERROR="cannot download the pgvector .dsc"; return 1; }
        echo "$PGVECTOR_DSC_SHA256  $dsc" | sha256sum -c --status \
            || { PGVECTOR_ERROR="pgvector .dsc checksum mismatch"; return 1; }
    fi
    grep -q "$PGVECTOR_ORIG_SHA256 [0-9]* pgvector_$PGVECTOR_VERSION.orig.tar.gz" "$dsc" \
        || { PGVECTOR_ERROR="the .dsc does not name the pinned tarball"; return 1; }
    if ! echo "$PGVECTOR_ORIG_SHA256  $orig" | sha256sum -c --status 2>/dev/null; then
        curl -fsSL --retry 3 -o "$orig" "$PGVECTOR_POOL/pgvector_$PGVECTOR_VERSION.orig.tar.gz" \
            || { PGVECTOR_ERROR="cannot download the pgvector tarball"; return 1; }
        echo "$PGVECTOR_ORIG_SHA256  $orig" | sha256sum -c --status \
            || { PGVECTOR_ERROR="pgvector tarball checksum mismatch"; return 1; }
    fi
    rm -rf "$src/build" && mkdir -p "$src/build"
    tar -xzf "$orig" -C "$src/build" --strip-components=1
    say "building pgvector $PGVECTOR_VERSION for $("$pgconfig" --version)"
    # OPTFLAGS empty: no -march=native, as Debian builds it (the build stays portable).
    make -s -C "$src/build" PG_CONFIG="$pgconfig" OPTFLAGS="" >&2 </dev/null \
        && make -s -C "$src/build" PG_CONFIG="$pgconfig" install >&2 </dev/null \
        || { PGVECTOR_ERROR="building pgvector failed"; return 1; }
}
if [ "$(id -u)" = 0 ] || [ -w "$("$PGBIN/pg_config" --pkglibdir 2>/dev/null || echo /nonexistent)" ]; then
    pgvector_build || { [ -n "$PGVECTOR_ERROR" ] || PGVECTOR_ERROR="pgvector could not be installed"; }
else
    PGVECTOR_ERROR="this user cannot install pgvector into PostgreSQL's extension directory"
fi
[ -z "$PGVECTOR_ERROR" ] || say "pgvector unavailable: $PGVECTOR_ERROR"

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
    [ -z "$PGVECTOR_ERROR" ] || printf 'export RG_TEST_PGVECTOR_ERROR=%q\n' "$PGVECTOR_ERROR"
} >"$ENV_FILE"
echo "export RG_TEST_POSTGRES_URL=$PG_URL"
echo "export RG_TEST_REDIS_URL=$REDIS_URL"
[ -z "$PGVECTOR_ERROR" ] || printf 'export RG_TEST_PGVECTOR_ERROR=%q\n' "$PGVECTOR_ERROR"
