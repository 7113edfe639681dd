"""Metrics history: per job class (and queue) and per minute, runs, failures, run time and a
histogram of run times, kept 72 hours by the minute and 30 days by the hour, in Redis.

A run is counted in memory by the feature's ``after`` hook (hook.py, recorder.py: one lock, no
I/O); the feature's heartbeat chore writes what was counted in one pipeline per beat (HINCRBY on
the minute's hash and on the hour's: the hour roll-up needs no process of its own). buckets.py
says which buckets and why, and how a field is named; api.py reads it back (the admin's
"Metrics" page, ``manage.py cogworker metrics``, deploy marks); metrics.py is the Prometheus
run-time histogram. ``COGWORKER["METRICS_HISTORY"] = False`` leaves it out of the worker.
"""
