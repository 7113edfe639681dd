"""The push side of the outbox: rows written with the pushing transaction, handed over at commit.

An :class:`Outbox` is built once per process by ``runtime.get_client`` when OUTBOX is on, and
given to the Client, which asks it for the database whose transaction is open
(:meth:`Outbox.atomic_alias`), gives it the jobs of a push inside one (:meth:`Outbox.stash`), and
the jobs of a push outside one that Redis refused (:meth:`Outbox.save`). Thread-safe: it keeps no
state (Django's connections are per thread).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, router, transaction

from ..push import payload as payloads
from .models import OutboxJob

logger = logging.getLogger(__name__)

CLAIM = 60.0  # seconds a claim on rows holds (relay.py; a unit's at commit, here)

HandOver = Callable[[Sequence[dict[str, Any]]], Any]


class Outbox:
    """Write outbox rows and hand them to Redis at commit (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock

    def atomic_alias(self) -> str | None:
        """The database whose transaction is open in this thread (the first found), or None."""
        # (Any database's, as defer_to_commit: a push inside atomic(using="other") is a row of
        # that database, written and rolled back with the rest of that transaction.)
        for conn in connections.all(initialized_only=True):
            if conn.in_atomic_block:
                return conn.alias
        return None

    def rows(self, items: Sequence[dict[str, Any]]) -> list[OutboxJob]:
        """The rows of ``items`` (payloads as the middleware let them through, ``at`` included)."""
        now = self.clock()
        return [OutboxJob(jid=item["jid"], payload=raw, created=now)
                for item, raw in zip(items, payloads.encode_many(items), strict=True)]

    def stash(self, alias: str, items: Sequence[dict[str, Any]], hand_over: HandOver) -> None:
        """Write ``items`` as rows in the transaction open on ``alias``; at its commit, hand them to
        ``hand_over`` and delete them. A rollback leaves no row and hands nothing over."""
        jids = [item["jid"] for item in items]
        if connections[alias].vendor == "postgresql":
            ids: list[Any] = _insert_pg(alias, jids, payloads.encode_many(items), self.clock())
        else:
            ids = [row.pk for row in OutboxJob.objects.using(alias).bulk_create(self.rows(items))]
        transaction.on_commit(lambda: self._hand_over(alias, ids, jids, items, hand_over), using=alias)

    def _hand_over(self, alias: str, ids: list[Any], jids: list[str], items: Sequence[dict[str, Any]],
                   hand_over: HandOver) -> None:
        """At commit: push the rows' jobs, then delete the rows. Raises nothing (the transaction is
        committed: its caller must not see a failure); a row not handed over waits for a relay."""
        try:
            hand_over(items)
        except Exception as exc:  # noqa: BLE001 - the rows wait for a relay: said, not raised
            logger.warning("at commit, %d job(s) not handed to Redis (%s: %s): they wait in the outbox of "
                           "database %r for a worker's relay", len(jids), type(exc).__name__, exc, alias)
            return
        try:
            _delete(alias, ids, jids)
        except Exception as exc:  # noqa: BLE001 - a relay deletes them; their marks keep them from running twice
            logger.warning("at commit, %d job(s) handed to Redis but their outbox rows in database %r not deleted "
                           "(%s: %s): a worker's relay deletes them", len(jids), alias, type(exc).__name__, exc)

    def stash_unit(self, alias: str, item: dict[str, Any], hand_over: HandOver) -> None:
        """Write outbox unit ``item`` (a batch's block: units.py) as a row in the transaction open on
        ``alias``; at its commit, claim the row, hand it to ``hand_over`` and delete it."""
        raw = payloads.encode(item)
        if connections[alias].vendor == "postgresql":
            pk: Any = _insert_pg(alias, [item["jid"]], [raw], self.clock())[0]
        else:
            pk = OutboxJob.objects.using(alias).bulk_create(self.rows([item]))[0].pk
        transaction.on_commit(lambda: self._run_unit(alias, pk, item["jid"], raw, hand_over), using=alias)

    def _run_unit(self, alias: str, pk: Any, jid: str, raw: str, hand_over: HandOver) -> None:
        """At commit: run the unit's row, claimed first (CLAIM seconds) so that no relay runs it at
        the same time (a unit's steps, unlike a job's push, are not safe run twice at once); its
        claim is let go when Redis refused it, for a relay. Raises nothing, as :meth:`_hand_over`."""
        manager = OutboxJob.objects.using(alias)
        row = manager.filter(pk=pk) if pk is not None else manager.filter(jid=jid)
        try:
            now = self.clock()
            if not row.filter(claimed_until__lt=now).update(claimed_by="commit", claimed_until=now + CLAIM):
                return  # (a relay has it)
        except Exception as exc:  # noqa: BLE001 - a relay runs it
            logger.warning("at commit, outbox unit %s not claimed in database %r (%s: %s): it waits for a "
                           "worker's relay", jid, alias, type(exc).__name__, exc)
            return
        try:
            hand_over([payloads.decode(raw)])
        except Exception as exc:  # noqa: BLE001 - the row waits for a relay: said, not raised
            logger.warning("at commit, a batch's jobs not handed to Redis (%s: %s): they wait in the outbox of "
                           "database %r for a worker's relay", type(exc).__name__, exc, alias)
            try:
                row.update(claimed_by="", claimed_until=0.0)
            except Exception:  # noqa: BLE001, S110 - its claim runs out
                pass
            return
        try:
            row.delete()
        except Exception as exc:  # noqa: BLE001 - a relay finds it done (units.py)
            logger.warning("at commit, a batch's outbox row in database %r not deleted (%s: %s): a worker's "
                           "relay deletes it", alias, type(exc).__name__, exc)

    def save(self, items: Sequence[dict[str, Any]]) -> None:
        """Write ``items`` as rows now (autocommit), for a relay: a push outside a transaction that
        Redis refused. Raises what the database refused."""
        alias = router.db_for_write(OutboxJob)
        OutboxJob.objects.using(alias).bulk_create(self.rows(items))


def _insert_pg(alias: str, jids: list[str], raws: list[str], created: float) -> list[int]:
    """PostgreSQL: insert the rows in one statement of one JSON parameter (the payloads in it as
    they are); return their ids. bulk_create's model objects, and psycopg's escaping of text arrays,
    cost a bulk of 1,000 jobs ten times what its PUSH costs."""
    rows = ",".join(f'{{"j":{json.dumps(jid)},"p":{raw}}}' for jid, raw in zip(jids, raws, strict=True))
    with connections[alias].cursor() as cursor:
        cursor.execute(f"INSERT INTO {OutboxJob._meta.db_table} (jid, payload, created, claimed_by, claimed_until) "
                       "SELECT j, p::text, %s, '', 0 FROM json_to_recordset(%s::json) AS r(j text, p json) "
                       "RETURNING id", [created, f"[{rows}]"])
        return [pk for (pk,) in cursor.fetchall()]


def _delete(alias: str, ids: list[Any], jids: list[str]) -> None:
    """Delete the rows: by id where the database gave them back, else (MySQL) by jid."""
    manager = OutboxJob.objects.using(alias)
    conn = connections[alias]
    if None in ids:  # (MySQL: no ids back from a bulk insert)
        manager.filter(jid__in=jids).delete()
    elif conn.vendor == "postgresql" and not conn.in_atomic_block:
        # One round trip, and the commit not waiting for its flush to disk (synchronous_commit off,
        # this transaction only): a job's row cost a second fsync of its own, after its
        # transaction's, three times what its push costs. A delete lost to a PostgreSQL crash in
        # the moment after it brings the row back: its mark keeps it from running twice.
        with conn.cursor() as cursor:
            cursor.execute(f"BEGIN; SET LOCAL synchronous_commit TO OFF; DELETE FROM {OutboxJob._meta.db_table} "
                           f"WHERE id IN ({','.join(str(int(pk)) for pk in ids)}); COMMIT")
    else:
        manager.filter(pk__in=ids).delete()
