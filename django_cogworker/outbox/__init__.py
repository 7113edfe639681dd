"""The transactional outbox: with ``COGWORKER["OUTBOX"] = True`` a committed transaction's jobs run,
even when Redis was away at its commit.

- ``models.py``: the table (``cogworker_outbox``), one row per job waiting to reach Redis.
- ``store.py``: the push side. A push inside ``transaction.atomic()`` writes its rows in that
  transaction and hands them to Redis at commit (then deletes them); a push outside one that Redis
  refuses is saved there (autocommit) instead of raising.
- ``relay/``: in every ``runcogworker`` process, a thread per database pushing the rows still
  waiting, oldest first, and deleting them. Every outbox job is written with a mark (in ``keys.outbox_marks``) in
  the same PUSH call: a row handed over twice (its pusher or relay killed before the delete) is
  not pushed twice.
  ``relay/rows.py`` reads a row (and what about it no pusher writes: dead-lettered or said);
  ``relay/connect.py`` gives the relay and the system check connections that give up connecting.
- ``api.py``: what operators see (waiting rows, the oldest's age) and "relay now", for the admin
  page, ``manage.py cogworker outbox`` and the metrics.

docs/outbox.md says what it guarantees, and its limits.
"""
