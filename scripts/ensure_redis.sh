#!/usr/bin/env bash
# Print the URL of a reachable Redis on stdout (only that; logs go to stderr), in this order:
#   1. $COGWORKER_REDIS_URL, as given;
#   2. a Redis answering PING on 127.0.0.1:$COGWORKER_PROBE_PORT (default 6379);
#   3. a private redis-server on 127.0.0.1:$COGWORKER_PRIVATE_PORT (default 6390), state in
#      .cogworker/, started here (daemonized) unless already running; installed if missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "ensure_redis: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ -n ${COGWORKER_REDIS_URL:-} ]]; then
    echo "$COGWORKER_REDIS_URL"
    exit 0
fi

probe_port=${COGWORKER_PROBE_PORT:-6379}
private_port=${COGWORKER_PRIVATE_PORT:-6390}
state_dir="$PWD/.cogworker"   # absolute: redis-server chdirs into --dir before using the paths

# redis_ping PORT: does a Redis on 127.0.0.1:PORT answer PONG? redis-cli may be absent on a fresh
# machine, so fall back to bash's /dev/tcp, in a subshell so a refused connect cannot kill us.
# Both are bounded in time: a non-Redis listener on the port would otherwise hang the probe.
redis_ping() {
    local port=$1
    if command -v redis-cli >/dev/null 2>&1 && command -v timeout >/dev/null 2>&1; then
        [[ $(timeout 3 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]
        return
    fi
    (
        exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
        printf 'PING\r\n' >&3
        IFS= read -r -t 2 reply <&3 || exit 1
        [[ $reply == +PONG* ]]
    ) 2>/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if redis_ping "$probe_port"; then
    log "using the Redis on 127.0.0.1:$probe_port"
    echo "redis://127.0.0.1:$probe_port/0"
    exit 0
fi

if redis_ping "$private_port"; then
    log "reusing the private Redis on 127.0.0.1:$private_port"
elif port_open "$private_port"; then
    die "127.0.0.1:$private_port is taken by something that does not answer PING (a Redis with a password?); set COGWORKER_PRIVATE_PORT to a free port, or COGWORKER_REDIS_URL"
else
    bash scripts/ensure_redis_server.sh >&2
    mkdir -p "$state_dir"
    log "no Redis on 127.0.0.1:$probe_port; starting a private one on 127.0.0.1:$private_port (log: $state_dir/redis.log)"
    # No persistence: demo state is disposable. Bound to loopback: it has no password.
    redis-server --bind 127.0.0.1 --port "$private_port" --daemonize yes \
        --dir "$state_dir" --pidfile "$state_dir/redis.pid" --logfile "$state_dir/redis.log" \
        --save "" --appendonly no >&2
    for _ in $(seq 50); do
        redis_ping "$private_port" && break
        sleep 0.1
    done
    redis_ping "$private_port" || {
        tail -n 20 "$state_dir/redis.log" >&2 2>/dev/null || true
        die "the private redis-server did not answer on port $private_port (is the port taken? set COGWORKER_PRIVATE_PORT)"
    }
fi
echo "redis://127.0.0.1:$private_port/0"
