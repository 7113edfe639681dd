#!/usr/bin/env bash
# `make demo`: find (or start) a Redis, migrate, enqueue the demo jobs, then run a worker in the
# foreground. PY names the Python (default .venv/bin/python).
#
# Every key the demo writes is under its own prefix, DEMO_PREFIX: the Redis it finds first is
# 127.0.0.1:6379, which other work on the machine may use, and the library's default prefix
# ("cogworker:") is the one a project of this machine would have its jobs under. Said on the first
# line, before anything else runs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PY:-.venv/bin/python}
DEMO_PREFIX="cogworker-demo:"

echo "demo: every key under the prefix \"$DEMO_PREFIX\" (COGWORKER_KEY_PREFIX), so a Redis other work uses keeps its own keys"
url=$(bash scripts/ensure_redis.sh)
export COGWORKER_REDIS_URL="$url" COGWORKER_KEY_PREFIX="$DEMO_PREFIX"
echo "demo: Redis at $("$py" -c 'import sys; from django_cogworker.conf import redact_url; print(redact_url(sys.argv[1]))' "$url"); to look at it: COGWORKER_KEY_PREFIX=$DEMO_PREFIX COGWORKER_REDIS_URL=... $py manage.py runserver (or cogworker stats)"
"$py" manage.py migrate --noinput
"$py" manage.py enqueue_demo
exec "$py" manage.py runcogworker
