"""The push side of the outbox: rows written with the pushing transaction, handed over at commit.

An :class:`Outbox` is built once per process by ``runtime.get_client`` when OUTBOX is on, and
given to the Client, which asks it for the database whose transaction is open
(:meth:`Outbox.atomic_alias`), gives it the jobs of a push inside one (:meth:`Outbox.stash`), and
the jobs of a push outside one that Redis refused (:meth:`Outbox.save`). Thread-safe: it keeps no
state (Django's connections are per thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, router, transaction

from ..errors import is_unavailable
from ..push import commit
from ..push import payload as payloads
from . import units
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

    def row(self, items: Sequence[dict[str, Any]]) -> OutboxJob:
        """The one row of ``items`` (payloads as the middleware let them through, ``at`` included)."""
        return OutboxJob(jid=items[0]["jid"], payload=row_payload(items), jobs=len(items), created=self.clock())

    def stash(self, alias: str, items: Sequence[dict[str, Any]], hand_over: HandOver) -> None:
        """Write ``items`` as one row in the transaction open on ``alias``; at its commit, hand them
        to ``hand_over`` and delete the row. A rollback leaves no row and hands nothing over."""
        pk = _insert(alias, self.row(items))
        transaction.on_commit(commit.waiting(alias, items, lambda member: self._hand_over(member, pk, hand_over)),
                              using=alias)

    def _hand_over(self, member: commit.Waiting, pk: Any, hand_over: HandOver) -> None:
        """At commit: push the row's jobs, then delete the row. Raises nothing (the transaction is
        committed: its caller must not see a failure); a row not handed over waits for a relay, as
        do the rest of its commit's once one found Redis away (:func:`_left_to_the_relay`)."""
        alias, items = member.commit.alias, member.jobs
        if member.commit.failure is not None:
            return  # (said with the first)
        try:
            hand_over(items)
        except Exception as exc:  # noqa: BLE001 - the row waits for a relay: said, not raised
            if is_unavailable(exc):
                _left_to_the_relay(member, exc)
            else:
                logger.warning("at commit, %d job(s) not handed to Redis (%s: %s): they wait in the outbox of "
                               "database %r for a worker's relay", len(items), type(exc).__name__, exc, alias)
            return
        try:
            _delete(alias, pk)
        except Exception as exc:  # noqa: BLE001 - a relay deletes it; the marks keep its jobs from running twice
            logger.warning("at commit, %d job(s) handed to Redis but their outbox row in database %r not deleted "
                           "(%s: %s): a worker's relay deletes it", len(items), alias, type(exc).__name__, exc)

    def stash_unit(self, alias: str, item: dict[str, Any], hand_over: HandOver) -> None:
        """Write outbox unit ``item`` (a batch's block: units.py) as a row in the transaction open on
        ``alias``; at its commit, claim the row, hand it to ``hand_over`` and delete it."""
        row = self.row([item])
        raw = row.payload
        pk = _insert(alias, row)
        transaction.on_commit(commit.waiting(alias, [item], lambda member: self._run_unit(member, pk, raw, hand_over)),
                              using=alias)

    def _run_unit(self, member: commit.Waiting, pk: Any, raw: str, hand_over: HandOver) -> None:
        """At commit: run the unit's row, claimed first (CLAIM seconds) so that no relay runs it at
        the same time (a unit's steps, unlike a job's push, are not safe run twice at once); its
        claim is let go when Redis refused it, for a relay. Raises nothing, as :meth:`_hand_over`."""
        alias, jid = member.commit.alias, member.jobs[0]["jid"]
        if member.commit.failure is not None:
            return  # (left unclaimed, to a relay: said with the first)
        row = OutboxJob.objects.using(alias).filter(pk=pk)
        try:
            now = self.clock()
            if not row.filter(claimed_until__lt=now).update(claimed_by="commit", claimed_until=now + CLAIM):
                return  # (a relay has it)
        except Exception as exc:  # noqa: BLE001 - a relay runs it
            logger.warning("at commit, outbox unit %s not claimed in database %r (%s: %s): it waits for a "
                           "worker's relay", jid, alias, type(exc).__name__, exc)
            return
        self.run_claimed(alias, pk, raw, hand_over, member=member)

    def run_claimed(self, alias: str, pk: Any, raw: str, hand_over: HandOver, when: str = "at commit",
                    member: commit.Waiting | None = None) -> bool:
        """Run unit row ``pk`` (its payload ``raw``), claimed by the caller, and delete it; its claim
        let go when Redis refused it, for a relay. Return whether it ran; raise nothing. ``member``:
        at a commit, the push it is of that commit's."""
        row = OutboxJob.objects.using(alias).filter(pk=pk)
        try:
            hand_over([payloads.decode(raw)])
        except Exception as exc:  # noqa: BLE001 - the row waits for a relay: said, not raised
            if member is not None and is_unavailable(exc):
                _left_to_the_relay(member, exc)
            else:
                logger.warning("%s, a batch's jobs not handed to Redis (%s: %s): they wait in the outbox of "
                               "database %r for a worker's relay", when, type(exc).__name__, exc, alias)
            try:
                row.update(claimed_by="", claimed_until=0.0)
            except Exception:  # noqa: BLE001, S110 - its claim runs out
                pass
            return False
        try:
            row.delete()
        except Exception as exc:  # noqa: BLE001 - a relay finds it done (units.py)
            logger.warning("%s, a batch's outbox row in database %r not deleted (%s: %s): a worker's "
                           "relay deletes it", when, alias, type(exc).__name__, exc)
        return True

    def save(self, items: Sequence[dict[str, Any]]) -> None:
        """Write ``items`` as a row now (autocommit), for a relay: a push outside a transaction that
        Redis refused. Raises what the database refused."""
        _insert(router.db_for_write(OutboxJob), self.row(items))


def _left_to_the_relay(member: commit.Waiting, exc: Exception) -> None:
    """Redis away at a commit, found by ``member``'s hand-over: its row and every other of the commit
    (those its commit runs next) are left to a worker's relay, untried, in one line. Each tried in
    turn waited its socket timeout on a Redis that doesn't answer (stopped, not refusing): five rows
    held the commit's caller 50 s, and 2,000 rows refused wrote 2,000 lines."""
    member.commit.failure = exc
    rows = [member, *member.commit.left(member)]
    blocks = sum(1 for row in rows if units.is_unit(row.jobs[0]))
    jobs = sum(len(row.jobs) for row in rows if not units.is_unit(row.jobs[0]))
    logger.warning("at commit, Redis didn't take the outbox rows of this transaction (%s: %s): %d row(s), %d job(s)%s, "
                   "wait in the outbox of database %r for a worker's relay", type(exc).__name__, exc, len(rows), jobs,
                   f" and {blocks} batch block(s)" if blocks else "", member.commit.alias)


def row_payload(items: Sequence[dict[str, Any]]) -> str:
    """A row's payload: one job's JSON object, or a JSON array of several (``jobs`` says how many)."""
    raws = payloads.encode_many(items)
    return raws[0] if len(raws) == 1 else f"[{','.join(raws)}]"


# (PostgreSQL: one statement, its id back, without a model object. The payloads of a bulk are one
# value: a row per job, in one statement of 1,000 rows (json_to_recordset), cost its INSERT and
# DELETE 15-25 us a job, more than its push; one row of them, about 3.)
_PG_INSERT = (f"INSERT INTO {OutboxJob._meta.db_table} (jid, payload, jobs, created, claimed_by, claimed_until) "
              "VALUES (%s, %s, %s, %s, '', 0) RETURNING id")


def _insert(alias: str, row: OutboxJob) -> Any:
    """Insert ``row`` in database ``alias`` (in the transaction open there, if any); return its id."""
    conn = connections[alias]
    if conn.vendor == "postgresql":
        with conn.cursor() as cursor:
            cursor.execute(_PG_INSERT, [row.jid, row.payload, row.jobs, row.created])
            return cursor.fetchone()[0]
    row.save(using=alias, force_insert=True)
    return row.pk


def _delete(alias: str, pk: Any) -> None:
    """Delete row ``pk``, handed to Redis."""
    conn = connections[alias]
    if conn.vendor == "postgresql" and not conn.in_atomic_block:
        # One round trip, and the commit not waiting for its flush to disk (synchronous_commit off,
        # this transaction only): a job's row cost a second fsync of its own, after its
        # transaction's, three times what its push costs. A delete lost to a PostgreSQL crash in
        # the moment after it brings the row back: its marks keep its jobs from running twice.
        with conn.cursor() as cursor:
            cursor.execute(f"BEGIN; SET LOCAL synchronous_commit TO OFF; DELETE FROM {OutboxJob._meta.db_table} "
                           f"WHERE id = {int(pk)}; COMMIT")
    else:
        OutboxJob.objects.using(alias).filter(pk=pk).delete()
