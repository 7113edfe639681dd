"""The test-suite's settings: the test project's (testproject/settings.py), plus what only the suite
needs. pytest runs on them (pyproject.toml) and so do the workers the tests start (tests/helpers.py's
Worker), so a worker reads the rows a test wrote in any of the three databases.

Kept out of the project's settings because Django 6's system checks open every database the
settings name: a newcomer's `manage.py check` would need a PostgreSQL and a MariaDB to answer, and
their drivers installed, for the sake of tests they don't run.
"""

import copy

from testproject import settings as project
from testproject.settings import *  # noqa: F403
from testproject.settings import STATE_DIR, env

# Copies: the project's module stays imported beside this one, its settings as they were.
DATABASES = copy.deepcopy(project.DATABASES)
LOGGING = copy.deepcopy(project.LOGGING)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not pytest-django's in-memory database: the outbox tests' workers (other processes)
    # read the rows the test writes.
    DATABASES["default"].setdefault("TEST", {"NAME": str(STATE_DIR / "test_db.sqlite3")})
# The second database: the outbox tests run on PostgreSQL as well as on SQLite (tests/*/test_outbox*.py),
# as a second alias, "pg". This machine and CI run one at 127.0.0.1:5432 (user postgres); `make test`
# finds or starts one and passes its URL (scripts/ensure_postgres.sh). Point the tests at another
# with COGWORKER_TEST_POSTGRES_URL (postgres://user:password@host:port/name; pytest-django creates
# and drops "test_<name>" there). Nothing else connects to it.
DATABASES["pg"] = env.db("COGWORKER_TEST_POSTGRES_URL", default="postgres://postgres@127.0.0.1:5432/cogworker")
# The third: MariaDB/MySQL, "mysql" (its relay's SELECT ... FOR UPDATE SKIP LOCKED: MariaDB 10.6+,
# MySQL 8). This machine and CI run a MariaDB at 127.0.0.1:3306 (root, no password); `make test`
# finds it (scripts/ensure_mysql.sh) and passes its URL, COGWORKER_TEST_MYSQL_URL
# (mysql://user:password@host:port/name). Driven by PyMySQL (the dev extra), installed as MySQLdb
# here only.
DATABASES["mysql"] = env.db("COGWORKER_TEST_MYSQL_URL", default="mysql://root@127.0.0.1:3306/cogworker")
if DATABASES["mysql"]["ENGINE"] == "django.db.backends.mysql":
    import pymysql

    pymysql.install_as_MySQLdb()
    DATABASES["mysql"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")
    DATABASES["mysql"].setdefault("TEST", {}).update(CHARSET="utf8mb4", COLLATION="utf8mb4_bin")

# What runcogworker shows under other logging setups (tests/workers/test_worker.py, test_joblog_workers.py).
if env.bool("TESTPROJECT_NO_LOGGING", False):
    LOGGING = {}  # as a project that configures none
if env.bool("TESTPROJECT_LOGGING_PLAIN", False):
    # As many projects write it: no filter on the handler whose format uses the job's fields, and a
    # logger that propagates (still no root handler).
    del LOGGING["handlers"]["console"]["filters"]
    del LOGGING["loggers"]["testproject"]["propagate"]
