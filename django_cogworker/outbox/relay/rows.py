"""Reading an outbox row for the relay (relay.py): its jobs, and what about it no pusher writes.

store.py writes every row this package makes; a row may still come from elsewhere (made by hand,
restored from a backup, written by a host whose clock is wrong) or hold a value no clock gives
(PostgreSQL stores NaN and Infinity in a float column). Each such row was kept waiting unseen or
lost without a line: one dated in the future (its pusher's clock 10 minutes ahead) waited those
10 minutes, "OLDEST 0.0s" and "Relay now" relaying nothing; ``created`` Infinity and
``claimed_until`` NaN never compared below now, so never relayed; a job whose ``"at"`` was
``1e309`` was scheduled with the score ``inf`` (never due, never dead); a second row holding a
used jid was answered by its pusher's receipt, deleted and never pushed, with no line.

Now every row is relayed, its job sent to dead, or logged; none is silently kept or dropped:

- a row's dates (``created``, ``claimed_until``) are read only to tell when to take it: a row
  dated further in the future than FRESH is taken at once (it is committed: it is a job that
  must run, and a relay racing its pusher's hand-over finds its marks), as is one whose claim
  runs out further ahead than FAR_CLAIM (no relay claims for that long) or never; each is said;
- a row's ``jobs`` count is what its payload holds, not what the column says (said when they differ);
- a job whose ``"at"`` is not a finite number goes to dead with the reason;
- two rows of one round holding the same jid: the same job is pushed once (the copy dropped, said);
  another job under a used jid goes to dead with the reason, both rows named (a jid is one job:
  its mark, its unique lock, its result record are keyed by it).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ...errors import PayloadError
from ...push import payload as payloads
from ..models import OutboxJob

# A claim running out further ahead than this is no relay's (theirs last store.CLAIM, 60 s; a
# pusher's clock ahead adds its skew): the row is taken, as a claim run out is.
FAR_CLAIM = 86400.0


def row_jobs(row: OutboxJob) -> list[dict[str, Any]]:
    """The jobs of ``row``: one payload (a JSON object), or a JSON array of several. Raise PayloadError."""
    if not row.payload.lstrip().startswith("["):
        return [payloads.decode(row.payload)]
    try:
        found = json.loads(row.payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"unparseable payload: {exc}") from exc
    if not isinstance(found, list) or not found or not all(map(_is_job, found)):
        raise PayloadError(f"a row of {row.jobs} jobs that is not a JSON array of jobs")
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_job(payload: Any) -> bool:
    """Whether ``payload`` passes payloads.decode's checks (a JSON object with a class, its arguments)."""
    return (isinstance(payload, dict) and isinstance(payload.get("class"), str)
            and isinstance(payload.get("args", []), list) and isinstance(payload.get("kwargs", {}), dict))


def oddities(row: OutboxJob, jobs: int | None, now: float, fresh: float) -> list[str]:
    """What about ``row`` (holding ``jobs`` jobs; None: unreadable) no pusher of this package writes."""
    found = []
    created, claimed = row.created, row.claimed_until
    if not math.isfinite(created):
        found.append(f"created {created!r}")
    elif created > now + fresh:
        found.append(f"dated {created - now:.0f}s ahead of this host's clock (its pusher's clock ahead?)")
    if not math.isfinite(claimed) or claimed > now + FAR_CLAIM:
        found.append(f"claimed until {claimed!r}")
    if jobs is not None and jobs != row.jobs:
        found.append(f"says it holds {row.jobs} job(s), holds {jobs}")
    return found


def bad_at(item: dict[str, Any]) -> str | None:
    """Why job ``item``'s ``"at"`` can't be a time to run it at (None: it can, or there is none)."""
    at = item.get("at")
    if at is None:
        return None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return f"its \"at\" ({at!r}) is not a time (a finite number of epoch seconds): it would never be due"
    return None


class Jids:
    """The jids of one round's jobs, to tell a row holding a jid another row of the round holds."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[OutboxJob, dict[str, Any]]] = {}

    def check(self, row: OutboxJob, item: dict[str, Any]) -> tuple[str, str] | None:
        """None: ``item`` of ``row`` is the first with its jid. Else ("copy", line): the same job as
        the one before, dropped; or ("other", reason): another job under that jid, for dead."""
        jid = item.get("jid")
        if not isinstance(jid, str):
            return None
        first = self._seen.get(jid)
        if first is None:
            self._seen[jid] = (row, item)
            return None
        first_row, first_item = first
        if first_item == item:
            return "copy", (f"outbox rows {first_row.pk} and {row.pk} both hold job {jid} ({item.get('class')}): "
                            f"the same job, pushed once; row {row.pk}'s copy dropped")
        return "other", (f"jid {jid} is also outbox row {first_row.pk}'s job ({first_item.get('class')}), a different "
                         f"one: a jid is one job (its mark, lock and result are keyed by it), so it isn't pushed")
