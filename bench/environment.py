"""Where a bench run runs, and what it runs against: the bench venv (the peers, psutil, matplotlib,
py-spy), Debian's Sidekiq, and the machine and versions every results JSON records."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV = BENCH / ".venv"
# (Only the standard library at module level: the driver runs this before it re-runs itself in the
# bench venv, with an interpreter that may lack redis-py.)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_venv() -> Path:
    """Create bench/.venv and install the peers and the work tree into it, when out of date."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    sources = [BENCH / "requirements.txt", ROOT / "pyproject.toml"]
    if not (python.exists() and subprocess.run([str(python), "-m", "pip", "--version"],
                                               capture_output=True).returncode == 0):
        shutil.rmtree(VENV, ignore_errors=True)
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        stamp.unlink(missing_ok=True)
    if not stamp.exists() or any(s.stat().st_mtime > stamp.stat().st_mtime for s in sources):
        log("installing the peers and django-cogworker into bench/.venv")
        subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        "-e", str(ROOT), "-r", str(BENCH / "requirements.txt")], check=True)
        stamp.touch()
    return python


# The async peers (the async-jobs section), each in a venv of its own beside bench/.venv, as its docs
# install it: arq wants redis-py < 6, taskiq-redis >= 8, so neither shares one with the other or with
# the bench's. hiredis in each, as in the bench venv (every Python system with the C reply parser).
# saq 0.26.4 imports typing_extensions without requiring it on Python 3.11: named here.
ASYNC_PEERS = {
    "arq": ["arq==0.28.0", "hiredis==3.5.0"],
    "saq": ["saq[redis]==0.26.4", "hiredis==3.5.0", "typing_extensions>=4.6"],
    "taskiq": ["taskiq==0.13.0", "taskiq-redis==1.2.4", "hiredis==3.5.0"],
}


def peer_venv(name: str) -> Path:
    return BENCH / f".venv-{name}"


def ensure_peer_venv(name: str) -> Path:
    """bench/.venv-<name> with that async peer installed (ASYNC_PEERS), made once; its python."""
    venv = peer_venv(name)
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    wanted = "\n".join(ASYNC_PEERS[name])
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"installing {', '.join(ASYNC_PEERS[name])} into {venv}")
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *ASYNC_PEERS[name]],
                   check=True)
    stamp.write_text(wanted)
    return python


def in_bench_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_sidekiq() -> str | None:
    """Install Debian's ruby-sidekiq if missing and possible; return why not, or None."""
    if shutil.which("sidekiq"):
        _ensure_ruby_hiredis()
        return None
    if not shutil.which("apt-get"):
        return "no apt-get on this machine"
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return "installing ruby-sidekiq needs root"
    log("installing ruby-sidekiq with apt-get (for the Sidekiq comparison)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    res = subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "ruby-sidekiq"], env=env, capture_output=True,
                         text=True)
    if res.returncode != 0:
        subprocess.run([*sudo, "apt-get", "update", "-qq"], env=env, capture_output=True)
        res = subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "ruby-sidekiq"], env=env,
                             capture_output=True, text=True)
    if res.returncode != 0 or not shutil.which("sidekiq"):
        return f"apt-get install ruby-sidekiq failed: {(res.stderr or res.stdout).strip()[-300:]}"
    _ensure_ruby_hiredis()
    return None


def _ensure_ruby_hiredis() -> None:
    """Debian's ruby-hiredis: Sidekiq's C reply parser, as hiredis is redis-py's (bench_jobs.rb loads
    it when present; without it Sidekiq runs the pure-Ruby driver, and the results' versions say so)."""
    if subprocess.run(["ruby", "-e", "require 'hiredis'"], capture_output=True).returncode == 0:
        return
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None or not shutil.which("apt-get"):
        return
    log("installing ruby-hiredis with apt-get (Sidekiq's C reply parser)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "ruby-hiredis"], env=env, capture_output=True)


# -- the machine and the versions --------------------------------------------------------------

def machine() -> dict[str, Any]:
    import harness

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    # (The cpuidle driver decides how deep an idle CPU sleeps, so what a wake-up costs: haltpoll, on a
    # KVM guest, polls a while before halting.)
    return {"nproc": os.cpu_count(), "cpu_model": model or platform.processor(),
            "cpuidle_driver": harness.cpuidle_driver(), "ram_gb": round(ram / 2**30, 1),
            "kernel": platform.release(), "os": _os_name()}


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def versions(redis_version: str) -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version(), "redis-server": redis_version}
    for dist in ("django-cogworker", "Django", "redis", "hiredis", "rq", "dramatiq", "huey", "celery", "kombu",
                 "psutil", "matplotlib", "py-spy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    for name in ASYNC_PEERS:
        site = sorted(peer_venv(name).glob("lib/python*/site-packages"))
        for dist in (name, "taskiq-redis", "redis") if site else ():
            found = sorted(site[0].glob(f"{dist.replace('-', '_')}-*.dist-info"))
            if found:
                out[f"{name}:{dist}" if dist != name else name] = found[0].name.split("-")[1].removesuffix(".dist")
    out["git"] = _git_describe()
    for name, argv in (("sidekiq", ["sidekiq", "-V"]), ("ruby", ["ruby", "-v"])):
        if shutil.which(argv[0]):
            res = subprocess.run(argv, capture_output=True, text=True)
            text = (res.stdout or res.stderr).strip().splitlines()
            if text:
                out[name] = text[-1].split(" INFO: ")[-1]
    if shutil.which("dpkg-query") and "sidekiq" in out:
        for pkg in ("ruby-redis", "ruby-hiredis"):
            res = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
            if res.returncode == 0 and res.stdout.strip():
                out[pkg] = res.stdout.strip()
    if "sidekiq" in out:
        # What bench_jobs.rb runs with: its Redis driver, YJIT or not, the warnings silenced or not.
        res = subprocess.run(["ruby", str(BENCH / "sidekiq" / "bench_jobs.rb")], capture_output=True, text=True,
                             env={**os.environ, "BENCH_CPU_BURN_LOOPS_RUBY": "1"})
        try:
            info = json.loads(res.stdout)
            out["sidekiq-redis-driver"] = info["driver"]
            out["sidekiq-yjit"] = str(info["yjit"]).lower()
            out["sidekiq-deprecation-warnings"] = "silenced" if info["silenced"] else "on"
        except (ValueError, KeyError):
            pass
    return out


def _git_describe() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
