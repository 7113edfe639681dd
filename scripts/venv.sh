#!/usr/bin/env bash
# Create .venv (with $PYTHON, default python3) if needed and `pip install -e '.[dev]'` only when
# pyproject.toml is newer than .venv/.installed, so repeated `make` runs cost nothing.
# VENV names another venv and EXTRA_PIP adds requirements to its install (scripts/venv313.sh:
# .venv313, Python 3.13 with Django 6.1, for the django.tasks tests).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "venv: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

python=${PYTHON:-python3}
venv=${VENV:-.venv}
extra=${EXTRA_PIP:-}
stamp=$venv/.installed

command -v "$python" >/dev/null 2>&1 || die "$python not found; install Python >= 3.11 or set PYTHON=/path/to/python3"

# Debian splits ensurepip into python3-venv / python3.X-venv; install it when we can.
install_venv_support() {
    command -v apt-get >/dev/null 2>&1 || return 1
    local as_root=() ver
    if [[ $(id -u) -ne 0 ]]; then
        sudo -n true 2>/dev/null || return 1
        as_root=(sudo -n)
    fi
    ver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    log "python venv support missing; installing python3-venv / python$ver-venv with apt-get"
    ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$ver-venv" >&2 \
        || ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
}

# A venv is usable only if its pip works (a failed earlier attempt can leave one without pip).
if ! { [[ -x $venv/bin/python ]] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; }; then
    rm -rf "$venv"
    log "creating $venv with $python"
    if ! "$python" -m venv "$venv"; then
        rm -rf "$venv"
        install_venv_support || die "'$python -m venv' failed; install your distribution's python3-venv package"
        "$python" -m venv "$venv"
    fi
fi

# (The stamp holds EXTRA_PIP: changing it reinstalls too.)
if [[ ! -f $stamp || pyproject.toml -nt $stamp || "$(cat "$stamp")" != "$extra" ]]; then
    log "installing the package with dev extras${extra:+ and $extra} into $venv"
    # shellcheck disable=SC2086 # (EXTRA_PIP is a list of requirements)
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -e '.[dev]' $extra
    printf '%s' "$extra" > "$stamp"
fi
