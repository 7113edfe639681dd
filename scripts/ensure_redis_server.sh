#!/usr/bin/env bash
# Make sure a `redis-server` binary is on PATH (the test-suite starts its own servers on free
# ports). Installs Debian's redis-server with apt-get when we are root or have passwordless sudo;
# otherwise fails saying what to install. Logs go to stderr, nothing to stdout.
set -euo pipefail

log() { echo "ensure_redis_server: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v redis-server >/dev/null 2>&1 && exit 0

how="install the 'redis-server' package (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"
command -v apt-get >/dev/null 2>&1 || die "redis-server is not on PATH and apt-get is missing; $how"

if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    die "redis-server is not on PATH and installing it needs root (no passwordless sudo); $how"
fi

log "redis-server not found; installing it with apt-get"
# noninteractive: no debconf prompts on a fresh machine.
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2

command -v redis-server >/dev/null 2>&1 || die "apt-get finished but redis-server is still not on PATH; $how"
log "installed $(redis-server --version)"
