# Developer entry points. Needs only python3 (>= 3.11) and make: the scripts create the venv and
# find, install or start Redis as needed.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
PY := .venv/bin/python
PY313 := .venv313/bin/python
PYTEST_ARGS ?=
# The suite runs in two tiers (tests/README.md): tests/fast starts no worker process (about 1,500
# tests, 3 minutes on a loaded 2-CPU machine), tests/workers runs real `runcogworker` processes.
# Each tier runs in this many processes (pytest-xdist), a file per process at a time: most of the
# time is spent waiting on worker subprocesses and Redis (the suite kept under half of 2 CPUs busy
# when run in one process: 20 minutes, against 8 in 4). The failover tests (marked serial) run
# alone after.
TEST_PROCESSES ?= 4
# The django.tasks tests, run a second time on Python 3.13 with Django 6.1 (.venv runs them on
# Python 3.11+ with Django 5.2 and the django-tasks backport, with the rest of the suite). They run
# beside the worker tier: both mostly wait on worker processes.
TASKS_TESTS := tests/fast/test_tasks.py tests/fast/test_results.py tests/fast/test_timeouts.py \
	tests/workers/test_tasks_workers.py tests/workers/test_results_workers.py tests/workers/test_timeouts_workers.py
# Each run prints its slowest tests (the fast tier's, the worker tier's, the failovers').
DURATIONS ?= 15

.PHONY: venv venv313 demo test test-fast tiers check screenshots lint clean distclean

venv:
	@PYTHON='$(PYTHON)' bash scripts/venv.sh

venv313: venv
	@bash scripts/venv313.sh

# Use (or start) a Redis, migrate, enqueue the demo jobs, then run a worker in the foreground; every
# key under the prefix "cogworker-demo:", said on the first line (scripts/demo.sh).
demo: venv
	@PY='$(PY)' bash scripts/demo.sh

# The suite starts its own redis-server processes on free ports; it only needs the binary. The
# admin's browser tests need Debian's chromium and chromedriver. The outbox tests need a PostgreSQL
# and a MariaDB/MySQL: scripts/ensure_postgres.sh finds one or starts a private one,
# scripts/ensure_mysql.sh finds one or starts Debian's, and their URLs are exported to every pytest
# run below (one shell, hence the backslashes). The fast tier runs first and a failure there stops
# the run; then the worker tier, and beside it the django.tasks tests on Python 3.13 (its output
# shown once it ended; databases of its own: the test databases' names are the same in each
# session); then the failovers alone (exit status 5: PYTEST_ARGS selected none).
test: venv venv313
	@bash scripts/ensure_redis_server.sh
	@bash scripts/ensure_chromium.sh
	@$(MAKE) --no-print-directory tiers
	$(PY) -m ruff check .
	$(PY) -m mypy
	COGWORKER_TEST_POSTGRES_URL=$$(bash scripts/ensure_postgres.sh); \
	COGWORKER_TEST_MYSQL_URL=$$(bash scripts/ensure_mysql.sh); \
	export COGWORKER_TEST_POSTGRES_URL COGWORKER_TEST_MYSQL_URL; \
	echo "PostgreSQL for the outbox tests: $$COGWORKER_TEST_POSTGRES_URL; MariaDB/MySQL: $$COGWORKER_TEST_MYSQL_URL"; \
	$(PY) -m pytest tests/fast -n $(TEST_PROCESSES) --dist loadfile -m "not serial" --durations=$(DURATIONS) $(PYTEST_ARGS); \
	tasks_log=$$(mktemp); \
	COGWORKER_STATE_DIR=.cogworker/py313 COGWORKER_TEST_POSTGRES_URL=$${COGWORKER_TEST_POSTGRES_URL}_py313 \
	  $(PY313) -m pytest -n 2 --dist loadfile -p no:cacheprovider $(TASKS_TESTS) >"$$tasks_log" 2>&1 & tasks=$$!; \
	workers=0; $(PY) -m pytest tests/workers -n $(TEST_PROCESSES) --dist loadfile -m "not serial" --durations=$(DURATIONS) $(PYTEST_ARGS) || workers=$$?; \
	tasks313=0; wait $$tasks || tasks313=$$?; \
	echo "== django.tasks on Python 3.13 (beside the worker tier) =="; cat "$$tasks_log"; rm -f "$$tasks_log"; \
	[[ $$workers -eq 0 && $$tasks313 -eq 0 ]]; \
	$(PY) -m pytest -m serial --durations=$(DURATIONS) $(PYTEST_ARGS) || [[ $$? -eq 5 ]]

# Only the fast tier (no worker process): what to run first after a change, in about 3 minutes.
test-fast: venv tiers
	@bash scripts/ensure_redis_server.sh
	COGWORKER_TEST_POSTGRES_URL=$$(bash scripts/ensure_postgres.sh); \
	COGWORKER_TEST_MYSQL_URL=$$(bash scripts/ensure_mysql.sh); \
	export COGWORKER_TEST_POSTGRES_URL COGWORKER_TEST_MYSQL_URL; \
	$(PY) -m pytest tests/fast -n $(TEST_PROCESSES) --dist loadfile -m "not serial" --durations=$(DURATIONS) $(PYTEST_ARGS)

# A test module left in tests/ itself would be run by neither tier: say where it goes.
tiers:
	@if compgen -G 'tests/test_*.py' >/dev/null; then \
	  echo "$$(ls tests/test_*.py): in neither tier; move to tests/fast/ (no worker process) or tests/workers/ (tests/README.md)"; \
	  exit 1; fi

# What CI runs (.ci/run is `make test`): the same, by the name other projects give it.
check: test

# Refresh the admin screenshots in docs/screenshots/ (the browser tests write them there).
screenshots: venv
	@bash scripts/ensure_redis_server.sh
	@bash scripts/ensure_chromium.sh
	COGWORKER_SCREENSHOTS=docs/screenshots $(PY) -m pytest tests/workers/test_admin_browser.py

lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy

# Removes local state (stopping the private demo Redis and test PostgreSQL first) and caches; keeps
# .venv.
clean:
	@if [[ -f .cogworker/redis.pid ]]; then kill "$$(cat .cogworker/redis.pid)" 2>/dev/null || true; fi
	@bash scripts/ensure_postgres.sh stop
	rm -rf .cogworker .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./.venv -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf .venv .venv313

# Benchmark cogworker against rq, dramatiq, huey, celery, Sidekiq and a bare redis-py loop (about
# 20 minutes): bench/run.py makes bench/.venv and its own redis-server, and writes bench/results/latest.json
# and docs/benchmarks.md. BENCH_ARGS="--full" adds the 1,000,000-job run; "--n 20000" is smaller; "--sections
# batches" runs one section (bench/sections/batches.py) alone into bench/results/batches.json, which
# `python bench/report.py` merges into the page. Only the latest results are kept: commit bench/results/ as is.
.PHONY: bench
BENCH_ARGS ?=
bench:
	@bash scripts/ensure_redis_server.sh
	$(PYTHON) bench/run.py $(BENCH_ARGS)
