# Developer entry points. Needs only python3 (>= 3.11) and make: the scripts create the venv and
# find, install or start Redis as needed.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
PY := .venv/bin/python
PY313 := .venv313/bin/python
PYTEST_ARGS ?=
# The suite runs in this many processes (pytest-xdist), a file per process at a time: most of its
# time is spent waiting on worker subprocesses and Redis (it kept under half of 2 CPUs busy run in
# one process: 20 minutes, against 8 in 4). The failover tests (marked serial) run alone after.
TEST_PROCESSES ?= 4
# The django.tasks tests, run a second time on Python 3.13 with Django 6.1 (.venv runs them on
# Python 3.11+ with Django 5.2 and the django-tasks backport, with the rest of the suite).
TASKS_TESTS := tests/fast/test_tasks.py tests/fast/test_results.py tests/fast/test_timeouts.py

.PHONY: venv venv313 demo test check screenshots lint clean distclean

venv:
	@PYTHON='$(PYTHON)' bash scripts/venv.sh

venv313: venv
	@bash scripts/venv313.sh

# Use (or start) a Redis, migrate, enqueue the demo jobs, then run a worker in the foreground; every
# key under the prefix "cogworker-demo:", said on the first line (scripts/demo.sh).
demo: venv
	@PY='$(PY)' bash scripts/demo.sh

# The suite starts its own redis-server processes on free ports; it only needs the binary. The
# admin's browser tests need Debian's chromium and chromedriver. The outbox tests need a PostgreSQL:
# scripts/ensure_postgres.sh finds one or starts a private one, and its URL is exported to every
# pytest run below (one shell, hence the backslashes; exit status 5 of the serial run: PYTEST_ARGS
# selected none of them).
test: venv venv313
	@bash scripts/ensure_redis_server.sh
	@bash scripts/ensure_chromium.sh
	$(PY) -m ruff check .
	$(PY) -m mypy
	COGWORKER_TEST_POSTGRES_URL=$$(bash scripts/ensure_postgres.sh); \
	export COGWORKER_TEST_POSTGRES_URL; \
	echo "PostgreSQL for the outbox tests: $$COGWORKER_TEST_POSTGRES_URL"; \
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile -m "not serial" $(PYTEST_ARGS); \
	$(PY) -m pytest -m serial $(PYTEST_ARGS) || [[ $$? -eq 5 ]]; \
	$(PY313) -m pytest -n $(TEST_PROCESSES) --dist loadfile $(TASKS_TESTS)

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
# 20 minutes): bench/run.py makes bench/.venv and its own redis-server, and writes bench/results/
# and docs/benchmarks.md. BENCH_ARGS="--full" adds the 1,000,000-job run; "--n 20000" is smaller; "--sections
# batches" runs one section alone (bench/report.py merges its JSON into the page).
.PHONY: bench
BENCH_ARGS ?=
bench:
	@bash scripts/ensure_redis_server.sh
	$(PYTHON) bench/run.py $(BENCH_ARGS)
