#!/usr/bin/env bash
# Print the URL of a PostgreSQL for the outbox tests on stdout (only that; logs go to stderr), in
# this order:
#   1. $COGWORKER_TEST_POSTGRES_URL, as given;
#   2. a PostgreSQL on 127.0.0.1:$COGWORKER_TEST_POSTGRES_PORT (default 5432) that lets user
#      postgres in without a password and may create databases (used as it is, never reconfigured);
#   3. a private cluster in .cogworker/pg/ on a free loopback port (from 5433 up), trust auth,
#      started here unless already running; Debian's `postgresql` is installed if missing.
# `ensure_postgres.sh stop` stops that private cluster (make clean), if it runs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "ensure_postgres: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

pg_dir="$PWD/.cogworker/pg"
data="$pg_dir/data"
# pytest-django creates test_<name>_gwN next to this name; the database itself need not exist.
db_name=cogworker

# The newest Debian server binaries (/usr/lib/postgresql/<major>/bin), else initdb on PATH.
find_bindir() {
    local dir
    dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
    if [[ -n $dir && -x $dir/initdb && -x $dir/pg_ctl ]]; then
        echo "$dir"
    elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
    else
        return 1
    fi
}

# PostgreSQL refuses to run as root: root runs the cluster as the user the package made.
as_pg() {
    if [[ $(id -u) -ne 0 ]]; then
        "$@"
    elif command -v runuser >/dev/null 2>&1; then
        runuser -u postgres -- "$@"
    else
        su -s /bin/bash postgres -c "$(printf '%q ' "$@")"
    fi
}

if [[ ${1:-} == stop ]]; then
    [[ -f $data/postmaster.pid ]] || exit 0
    bindir=$(find_bindir) || die "a private cluster may run in $data but pg_ctl is missing"
    # fast: the tests' sessions are disposable; waiting for them would hang make clean.
    as_pg "$bindir/pg_ctl" -D "$data" -m fast -w stop >&2 || true
    exit 0
fi

if [[ -n ${COGWORKER_TEST_POSTGRES_URL:-} ]]; then
    echo "$COGWORKER_TEST_POSTGRES_URL"
    exit 0
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# can_use PORT: does a PostgreSQL on 127.0.0.1:PORT let user postgres in (no password prompt) with
# the right to create the tests' databases? psql when installed, else psycopg from the venv; both
# bounded in time, so a listener that is not PostgreSQL cannot hang us.
can_use() {
    local port=$1 sql="select rolsuper or rolcreatedb from pg_roles where rolname = current_user"
    port_open "$port" || return 1
    if command -v psql >/dev/null 2>&1; then
        [[ $(PGCONNECT_TIMEOUT=3 psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -w -XAtqc "$sql" 2>/dev/null) == t ]]
    elif [[ -x .venv/bin/python ]]; then
        .venv/bin/python - "$port" "$sql" 2>/dev/null <<'EOF'
import sys
import psycopg
with psycopg.connect(host="127.0.0.1", port=sys.argv[1], user="postgres", dbname="postgres", connect_timeout=3) as c:
    sys.exit(0 if c.execute(sys.argv[2]).fetchone()[0] else 1)
EOF
    else
        return 1
    fi
}

probe_port=${COGWORKER_TEST_POSTGRES_PORT:-5432}
if can_use "$probe_port"; then
    log "using the PostgreSQL on 127.0.0.1:$probe_port"
    echo "postgres://postgres@127.0.0.1:$probe_port/$db_name"
    exit 0
fi

# --- The private cluster. ---
if ! bindir=$(find_bindir); then
    how="install Debian's 'postgresql' package (apt-get install postgresql), or set COGWORKER_TEST_POSTGRES_URL"
    command -v apt-get >/dev/null 2>&1 || die "no PostgreSQL server binaries (initdb, pg_ctl) and apt-get is missing; $how"
    if [[ $(id -u) -eq 0 ]]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        die "no PostgreSQL server binaries (initdb, pg_ctl) and installing them needs root (no passwordless sudo); $how"
    fi
    log "no PostgreSQL server binaries; installing postgresql with apt-get"
    # noninteractive: no debconf prompts on a fresh machine.
    ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    bindir=$(find_bindir) || die "apt-get finished but initdb / pg_ctl are still missing; $how"
fi
if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root and there is no 'postgres' user to run the private cluster as (PostgreSQL refuses root); run make test as another user, or set COGWORKER_TEST_POSTGRES_URL"
fi

mkdir -p "$pg_dir"
# Two make test at once must not both initdb or start it.
exec 9>"$PWD/.cogworker/pg.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 120 9 || die "another ensure_postgres.sh has held .cogworker/pg.lock for 2 minutes"
fi

if [[ $(id -u) -eq 0 ]]; then
    chown postgres: "$pg_dir"
    as_pg test -w "$pg_dir" -a -x "$pg_dir" || die "user postgres cannot reach $pg_dir (a parent directory closed to others?); move the checkout, or set COGWORKER_TEST_POSTGRES_URL"
fi

ready() { "$bindir/pg_isready" -q -h 127.0.0.1 -p "$1" -U postgres -d postgres -t 3; }

if [[ ! -f $data/PG_VERSION ]]; then
    log "creating a private PostgreSQL cluster in $data"
    as_pg "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C >"$pg_dir/initdb.log" 2>&1 || {
        tail -n 20 "$pg_dir/initdb.log" >&2
        die "initdb failed (log: $pg_dir/initdb.log)"
    }
    # Loopback only: trust auth has no password. No Unix socket: its default directory may not
    # exist here. No durability: the tests' databases are dropped after each run anyway.
    as_pg tee -a "$data/postgresql.conf" >/dev/null <<'EOF'

# cogworker's private test cluster (scripts/ensure_postgres.sh)
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
fi

# Running: reuse it, on the port it listens on (line 4 of postmaster.pid).
if as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    port=$(sed -n 4p "$data/postmaster.pid")
    for _ in $(seq 50); do ready "$port" && break; sleep 0.2; done
    ready "$port" || die "the private PostgreSQL in $data runs but does not answer on 127.0.0.1:$port (log: $pg_dir/postgres.log)"
    log "reusing the private PostgreSQL on 127.0.0.1:$port"
else
    # The port it had last time if still free (a stable URL), else the first free one from 5433.
    port=$(cat "$pg_dir/port" 2>/dev/null || echo 5433)
    while port_open "$port"; do
        port=$((port + 1))
        ((port < 5533)) || die "no free port in 5433-5532 for the private PostgreSQL; set COGWORKER_TEST_POSTGRES_URL"
    done
    echo "$port" >"$pg_dir/port"
    log "starting the private PostgreSQL on 127.0.0.1:$port (log: $pg_dir/postgres.log)"
    # 9>&-: the server must not inherit the lock, or it would hold it as long as it runs.
    as_pg "$bindir/pg_ctl" -D "$data" -l "$pg_dir/postgres.log" -o "-p $port" -w -t 60 start >&2 9>&- || {
        tail -n 20 "$pg_dir/postgres.log" >&2 2>/dev/null || true
        die "the private PostgreSQL did not start (log: $pg_dir/postgres.log)"
    }
    ready "$port" || die "the private PostgreSQL started but does not answer on 127.0.0.1:$port"
fi
echo "postgres://postgres@127.0.0.1:$port/$db_name"
