#!/usr/bin/env bash
# Make .venv313: Python 3.13 with Django 6.1, where `make test` runs the django.tasks tests a
# second time (.venv runs them on Django 5.2 with the django-tasks backport). Python 3.13 is taken
# from PYTHON313, PATH, or pyenv's versions, else installed with uv (`uv python install 3.13`,
# uv itself pip-installed into .venv). Never skipped: without a Python 3.13 this fails, saying so.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "venv313: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

is_313() { [[ -n $1 && -x $1 ]] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; }

find_python313() {
    local candidate
    for candidate in "${PYTHON313:-}" "$(command -v python3.13 || true)"; do
        if is_313 "$candidate"; then echo "$candidate"; return 0; fi
    done
    local root
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    for candidate in "$root"/versions/3.13*/bin/python3.13; do
        if is_313 "$candidate"; then echo "$candidate"; return 0; fi
    done
    return 1
}

python313=$(find_python313) || {
    log "no Python 3.13 on PATH or under pyenv; installing one with uv"
    [[ -x .venv/bin/python ]] || die ".venv is missing: run scripts/venv.sh first"
    .venv/bin/python -m pip install --disable-pip-version-check -q uv >&2 || die "could not pip-install uv"
    .venv/bin/python -m uv python install 3.13 >&2 || die "'uv python install 3.13' failed; install Python 3.13 \
and set PYTHON313=/path/to/python3.13"
    python313=$(.venv/bin/python -m uv python find 3.13) || die "uv installed no Python 3.13"
}
is_313 "$python313" || die "$python313 is not Python 3.13"

PYTHON=$python313 VENV=.venv313 EXTRA_PIP='Django>=6.1,<6.2' exec bash scripts/venv.sh
