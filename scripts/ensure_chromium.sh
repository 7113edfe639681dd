#!/usr/bin/env bash
# Make sure Debian's `chromium` and `chromium-driver` are installed (the admin's browser tests drive
# a headless Chromium through selenium; selenium must not download a browser of its own). Same
# pattern as ensure_redis_server.sh: apt-get when we are root or have passwordless sudo, otherwise
# fail saying what to install. Logs go to stderr, nothing to stdout.
set -euo pipefail

log() { echo "ensure_chromium: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
have && exit 0

how="install Debian's 'chromium' and 'chromium-driver' packages (apt-get install chromium chromium-driver)"
command -v apt-get >/dev/null 2>&1 || die "chromium or chromedriver is not on PATH and apt-get is missing; $how"

if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    die "chromium or chromedriver is not on PATH and installing them needs root (no passwordless sudo); $how"
fi

log "chromium / chromedriver not found; installing them with apt-get"
# noninteractive: no debconf prompts on a fresh machine.
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >&2

have || die "apt-get finished but chromium or chromedriver is still not on PATH; $how"
log "installed $(chromium --version 2>/dev/null | head -n1)"
