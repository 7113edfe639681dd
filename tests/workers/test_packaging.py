"""The distribution: `python -m build` makes an sdist and a wheel without a warning, the wheel
holds the templates, py.typed and the license and declares what PyPI shows, and, installed in a
fresh virtualenv, it serves `manage.py cogworker` against a real Redis; with its `testproject`
extra, the test project's check, migrate and `make demo` run on Django 5.2 and 6.1 with no
database server.

Built once for the module, from a copy of the sources (the build leaves nothing in the checkout),
with `--no-isolation` (build and setuptools come from the dev extra: no download).
"""

from __future__ import annotations

import email
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import redis
from helpers import FAST_ENV, poll

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_cogworker"
# What a source distribution is built from (MANIFEST.in names the rest of it).
SOURCES = ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "manage.py", "Makefile", "django_cogworker",
           "docs", "tests", "testproject")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """(the wheel, the build's output)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    # (PYTHONDONTWRITEBYTECODE makes setuptools warn that it won't byte-compile: not the package's doing.)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = out.glob("*.whl")
    return wheel, run.stdout + run.stderr


def test_the_build_is_clean(built):
    _, output = built
    lines = [line for line in output.splitlines() if "warning" in line.lower() or "deprecat" in line.lower()]
    # MANIFEST.in's global-exclude of compiled files says it found none in this fresh copy (a
    # checkout in use has them, and they must stay out of the sdist): the one expected note.
    expected = re.compile(r"warning: no previously-included files matching '(__pycache__|\*\.py\[cod\])' found")
    assert [line for line in lines if not expected.match(line)] == []


def test_the_wheel_holds_the_package_data_and_only_the_package(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {str(p.relative_to(ROOT)) for p in (PACKAGE / "templates").rglob("*") if p.is_file()}
    assert templates and templates <= names
    assert "django_cogworker/py.typed" in names
    assert "django_cogworker/management/commands/cogworker.py" in names
    assert "django_cogworker/metrics/views.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "testproject/", "bench/"))]


def test_the_sdist_holds_what_its_test_suite_needs(built):
    wheel, _ = built
    (sdist,) = wheel.parent.glob("*.tar.gz")
    names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "manage.py", "tests/conftest.py", "tests/helpers.py",
            "testproject/settings.py", "testproject/suite_settings.py", "docs/cli.md",
            "django_cogworker/py.typed"} <= names
    assert not [n for n in names if "__pycache__" in n or n.startswith("bench/")]


def test_the_metadata_is_ready_to_publish(built):
    wheel, _ = built
    archive = zipfile.ZipFile(wheel)
    (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = email.message_from_bytes(archive.read(metadata_name))
    assert metadata["Name"] == "django-cogworker" and metadata["License-Expression"] == "MIT"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().startswith("# django-cogworker")  # the README, as the long description
    classifiers = metadata.get_all("Classifier")
    assert "Framework :: Django" in classifiers and "Typing :: Typed" in classifiers
    requires = metadata.get_all("Requires-Dist")
    # django-environ only for the test project, never pulled into a user's install:
    assert sorted(r for r in requires if r.startswith("django-environ")) == [
        'django-environ>=0.11; extra == "dev"', 'django-environ>=0.11; extra == "testproject"']
    assert {r.split(">")[0] for r in requires if "extra" not in r} == {"Django", "redis", "croniter"}
    # `make demo` runs on .venv, which has the dev extra: all the test project needs is in it too.
    extra = {name: {r.split(";")[0] for r in requires if r.endswith(f'extra == "{name}"')}
             for name in ("testproject", "dev")}
    assert extra["testproject"] and extra["testproject"] <= extra["dev"]


SETTINGS = """
SECRET_KEY = "packaging-test"
INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                  "django.contrib.sessions", "django.contrib.messages", "django_cogworker"]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
DATABASES = {}
COGWORKER = {"QUEUES": ["default"]}
USE_TZ = True
"""

PROBE = """
import json, pathlib, sys
sys.modules["environ"] = None  # django-environ can't be imported: the package must not need it
import django
django.setup()
import django_cogworker
from django.core.management import call_command
from django.template.loader import get_template
import io
out = io.StringIO()
call_command("cogworker", "stats", "--json", stdout=out)
print(json.dumps({"file": django_cogworker.__file__,
                  "template": get_template("admin/cogworker/dashboard.html").origin.name,
                  "typed": (pathlib.Path(django_cogworker.__file__).parent / "py.typed").exists(),
                  "stats": json.loads(out.getvalue())}))
"""


def test_the_wheel_installs_in_a_fresh_virtualenv_and_serves_the_cli(built, tmp_path, redis_url, rb):
    wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(fresh), "install", "--quiet", "--no-deps",
                    "--no-index", "--disable-pip-version-check", str(wheel)], check=True, timeout=120)
    # The dependencies from this venv's site-packages, listed in a .pth file: its own .pth files
    # (the editable install of the checkout) are not read from a directory a .pth file adds.
    fresh_site = subprocess.run([str(fresh), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    Path(fresh_site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (tmp_path / "probe_settings.py").write_text(SETTINGS)
    rb.set("cogworker:stat:processed", 7)
    env = {"PATH": os.environ["PATH"], "COGWORKER_REDIS_URL": redis_url,
           "DJANGO_SETTINGS_MODULE": "probe_settings", "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([str(fresh), "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    probe = json.loads(run.stdout)
    assert probe["file"].startswith(str(venv)) and probe["template"].startswith(str(venv))
    assert probe["typed"] is True
    assert probe["stats"]["processed"] == 7


# The test project as a newcomer runs it: `pip install '.[testproject]'` in a fresh virtualenv, then
# `manage.py check` and `make demo` (migrate, enqueue the demo's jobs, runcogworker), with neither
# DATABASE_URL nor DJANGO_SETTINGS_MODULE set. Django 6's checks open every database the settings
# name, so the PostgreSQL and MariaDB named there for the suite's sake failed `check` (issue 42):
# no driver installed, then no server to answer.
NEWCOMER_VENVS = {"5.2": ".venv", "6.1": ".venv313"}  # Django series -> the venv whose Python runs it
PROJECT = ("manage.py", "testproject", "scripts/demo.sh", "scripts/ensure_redis.sh")  # a clone's, for `make demo`
DEMO_PREFIX = "cogworker-demo:"
SECRET = "the newcomer's secret"

# Run by `manage.py shell -c`: pushes one of the demo's encrypted jobs and says what databases the
# settings name and which of their drivers the venv holds.
SHELL = f"""
import json
from importlib.util import find_spec
from django.conf import settings
from testproject.demo.secret_jobs import SecretJob
SecretJob.perform_async("{DEMO_PREFIX}secret", {SECRET!r})
print(json.dumps({{"engines": {{alias: db["ENGINE"] for alias, db in settings.DATABASES.items()}},
                  "drivers": [m for m in ("psycopg", "psycopg2", "MySQLdb", "pymysql") if find_spec(m)]}}))
"""


@pytest.mark.parametrize("django_series", sorted(NEWCOMER_VENVS))
def test_the_test_project_runs_on_its_extra_alone_with_no_database_server(built, tmp_path, redis_url, django_series):
    wheel, _ = built
    python = ROOT / NEWCOMER_VENVS[django_series] / "bin" / "python"  # (make test makes both)
    venv = tmp_path / "venv"  # (on that venv's base Python, nothing of its site-packages)
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh = venv / "bin" / "python"
    # From the machine's index, as `make venv` installs, and pip's cache: a few seconds.
    pip = subprocess.run([str(python), "-m", "pip", "--python", str(fresh), "install", "--quiet", "--no-compile",
                          f"{wheel}[testproject]", f"Django~={django_series}.0"],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    project = tmp_path / "project"
    for name in PROJECT:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, project / name)
    url = redis_url.rsplit("/", 1)[0] + "/8"  # (a database of its own, as test_demo.py's)
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    # Nothing of the suite's environment: no DATABASE_URL, no DJANGO_SETTINGS_MODULE, no PYTHONPATH.
    # (The demo's key prefix from the start, as demo.sh sets it: the job pushed below is one of its.)
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", "COGWORKER_REDIS_URL": url,
           "COGWORKER_KEY_PREFIX": DEMO_PREFIX, **FAST_ENV}

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(fresh), "manage.py", *args], cwd=project, env=env, capture_output=True, text=True,
                              timeout=120)

    check = manage("check")
    assert check.returncode == 0 and "System check identified no issues" in check.stdout, check.stdout + check.stderr
    shell = manage("shell", "-c", SHELL)
    assert shell.returncode == 0, shell.stdout + shell.stderr
    said = json.loads(shell.stdout.splitlines()[-1])
    assert said == {"engines": {"default": "django.db.backends.sqlite3"}, "drivers": []}  # no server to consult

    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=project, env={**env, "PY": str(fresh)},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        # (The six limited PartnerCallJobs, the demo's last to run but the scheduled ones.)
        ran = poll(lambda: r.llen(f"{DEMO_PREFIX}partner-calls:done") == 6 and r.llen(f"{DEMO_PREFIX}secret") == 1,
                   timeout=90)
    finally:
        demo.send_signal(signal.SIGTERM)  # (the worker: the script exec'd it)
        demo.wait(60)
    assert ran, f"the demo's jobs didn't all run; its output:\n{log.read_text()}"
    [record] = [json.loads(item) for item in r.lrange(f"{DEMO_PREFIX}secret", 0, -1)]
    r.flushdb()
    r.close()
    assert record["seen"] == hashlib.sha256(SECRET.encode()).hexdigest()  # decrypted with the project's key
    assert demo.returncode == 0, log.read_text()
