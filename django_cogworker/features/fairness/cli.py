"""``manage.py cogworker groups QUEUE`` (a queue's groups, the busiest first: waiting, paused) and
``cogworker pause QUEUE --group G`` / ``resume QUEUE --group G`` (``unpause`` too): through ``api``
as the admin's queue page does."""

from __future__ import annotations

from ... import api
from ...cli.actions import Outcome
from ...cli.listings import Listing
from ...cli.output import listing as document
from ...cli.output import more_note
from ...errors import CogworkerError


def groups(name: str, page: int, limit: int) -> Listing:
    """One page of the queue's groups; the note says the groups' total, the jobs in them and the
    prioritized, and any lane key of the wrong type."""
    found = api.Queue(name).groups(page, limit)
    result = found.page
    items = [{"group": g.id, "waiting": g.waiting, "paused": g.paused, "poisoned": g.poisoned} for g in result.items]
    rows = [[i["group"], i["waiting"] if not i["poisoned"] else f"poisoned ({i['poisoned']})", i["paused"]]
            for i in items]
    doc = {**document(items, page=result.number, per_page=result.per_page, total=result.total),
           "grouped": found.grouped, "prioritized": found.prioritized, "poisoned": found.poisoned}
    notes = [f"{found.groups:,} group(s) holding {found.grouped:,} job(s); {found.prioritized:,} prioritized job(s)"]
    if found.poisoned:
        notes.append(f"poisoned lane keys (the key guard moves them aside): {', '.join(found.poisoned)}")
    more = more_note(result.number, result.per_page, result.total, len(items))
    return Listing(["GROUP", "WAITING", "PAUSED"], rows, doc, "\n".join([*notes, *([more] if more else [])]))


def pause(name: str, group_ids: list[str], *, resume: bool) -> Outcome:
    """Pause (or resume) each group of queue ``name``: its jobs stay; a pause takes effect at once (a
    fetch under way may still take one job of it)."""
    outcome, queue = Outcome(), api.Queue(name)
    for group in group_ids:
        try:
            changed = queue.resume_group(group) if resume else queue.pause_group(group)
        except CogworkerError as exc:
            outcome.failed.append(f"{name} group {group!r}: {exc}")
            continue
        verb = "resumed" if resume else "paused"
        state = verb if changed else f"already {'running' if resume else 'paused'}"
        outcome.done.append(f"{name} group {group}: {state}")
    return outcome
