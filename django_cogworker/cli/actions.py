"""What the write commands of ``manage.py cogworker`` do, through ``api`` as the admin does.

Each returns an ``Outcome``: a line per thing done, and a line per thing named that wasn't
there or was refused. The command prints the first and fails (exit FAILED) on the second,
after doing everything it could: ``retry dead A B`` with B gone still retries A.
"""

from __future__ import annotations

import dataclasses
import json

from django.core.management.base import CommandError

from .. import api
from .listings import SETS, known_queues
from .output import USAGE, cell


@dataclasses.dataclass
class Outcome:
    done: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)


def confirm(yes: bool, what: str) -> None:
    if not yes:
        raise CommandError(f"{what} can't be undone: add --yes to do it", returncode=USAGE)


def pause(names: list[str], *, unpause: bool, force: bool) -> Outcome:
    """Pause or unpause each queue. An unknown name is refused (a typo paused nothing anyone
    noticed); ``force`` pauses it ahead of its first push.

    Each line says when it takes effect ("default: paused", and a job pushed right after ran all
    the same): a process reads the paused queues at each heartbeat, and a fetch of its already
    waiting on the queue (BLOCK_TIMEOUT at most) may still take a job; what it took runs.
    """
    from ..engine.fetch.contract import BLOCK_TIMEOUT
    from ..push import runtime

    outcome, known = Outcome(), known_queues()
    verb = "unpaused" if unpause else "paused"
    within = f"at its next heartbeat, within {runtime.get_config().heartbeat_interval + BLOCK_TIMEOUT:g}s"
    when = (f"each process fetches from it again {within}" if unpause else
            f"each process stops fetching from it {within}; the jobs it took by then still run")
    for name in names:
        if name not in known and not force:
            outcome.failed.append(f"no such queue {cell(name)!r} (nothing was pushed to it and QUEUES doesn't "
                                  f"list it); --force to {verb[:-1]} it all the same")
            continue
        queue = api.Queue(name)
        queue.unpause() if unpause else queue.pause()
        outcome.done.append(f"{cell(name)}: {verb} ({when})")
    return outcome


def clear(names: list[str], *, yes: bool) -> Outcome:
    """Delete every waiting job of each queue."""
    confirm(yes, "clearing a queue deletes its waiting jobs, which")
    outcome, known = Outcome(), known_queues()
    for name in names:
        if name not in known:
            outcome.failed.append(f"no such queue {cell(name)!r}")
            continue
        outcome.done.append(f"{cell(name)}: cleared, {api.Queue(name).clear()} job(s) deleted")
    return outcome


def _find(entries: api.SortedSet, ref: str) -> tuple[api.SortedEntry | None, bool]:
    """(the entry ``ref`` names, whether the whole set was searched).

    A token (``--json``'s ``token``: score|ident) is exact and O(log n), and names entries that
    have no jid (unparseable ones); a jid is looked for by the api's bounded filter.
    """
    if "|" in ref:
        return entries.find(ref), True
    # The jid as a JSON string anywhere, then checked: a payload written with other spacing is found too.
    page = entries.page(1, api.MAX_PER_PAGE, substring=json.dumps(ref))
    return next((e for e in page.items if e.jid == ref), None), page.complete


def on_entries(kind: str, jids: list[str], *, delete: bool, every: bool, yes: bool) -> Outcome:
    """Retry (enqueue now) or delete entries of the scheduled, retry or dead set, by jid or all."""
    entries = SETS[kind]()
    outcome = Outcome()
    if every == bool(jids):
        raise CommandError(f"name the jobs by jid, or --all for every entry of {kind}", returncode=USAGE)
    if every:
        confirm(yes, f"{'deleting' if delete else 'retrying'} every entry of {kind}")
        if delete:
            outcome.done.append(f"{kind}: {entries.delete_all()} deleted")
        else:
            # One pass over what the set holds now (entries added meanwhile can't keep it going).
            done = entries.retry_some(limit=entries.size() + api.BATCH, budget=float("inf"))
            outcome.done.append(f"{kind}: {done.moved} enqueued"
                                + (f", {done.buried} sent to dead (can't be written back)" if done.buried else ""))
            if done.stuck:
                outcome.failed.append(f"{kind}: {done.stuck} left in place (no queue named, unreadable, or "
                                      "poison); see them with the admin")
        return outcome
    if delete:
        confirm(yes, "deleting a job")
    for jid in jids:
        entry, whole = _find(entries, jid)
        if entry is None:
            outcome.failed.append(f"{cell(jid)}: not in {kind}" + ("" if whole else " (among the entries searched; "
                                                                    "the set is larger than one search covers)"))
            continue
        try:
            moved = entry.delete() if delete else entry.retry_now()
        except api.ActionRefused as exc:
            outcome.failed.append(f"{cell(jid)}: {exc}")
            continue
        if moved:
            outcome.done.append(f"{cell(jid)}: {'deleted' if delete else 'enqueued'}")
        else:
            outcome.failed.append(f"{cell(jid)}: gone from {kind} meanwhile (the poller took it, or another hand)")
    return outcome


def signal(name: str, identities: list[str], *, every: bool) -> Outcome:
    """Send ``quiet`` or ``stop`` to each live process named, or to all of them."""
    processes = api.ProcessSet()
    outcome = Outcome()
    if every == bool(identities):
        raise CommandError("name the processes by identity (see `cogworker processes`), or --all", returncode=USAGE)
    targets = list(processes) if every else []
    for identity in identities:
        process = processes.get(identity)
        if process is None:
            outcome.failed.append(f"{cell(identity)}: no such live process")
        else:
            targets.append(process)
    for process in targets:
        process.signal(name)
        outcome.done.append(f"{cell(process.identity)}: {name} sent (read at its next heartbeat)")
    if every and not targets:
        outcome.done.append("no live process")
    return outcome


def cancel(jid: str, *, interrupt: bool) -> Outcome:
    """Cancel job ``jid`` wherever it is (``django_cogworker.cancel``): taken off a queue, the schedule or the
    retries, or, running, asked to stop (``interrupt``: Cancelled raised in its thread)."""
    # Imported here: the core's public cancel (features/cancellation/cancel.py), needed only by this command.
    from ..errors import InvalidArgument, JobNotFound, NotCancellable
    from ..features.cancellation.cancel import cancel as cancel_job

    outcome = Outcome()
    try:
        done = cancel_job(jid, interrupt=interrupt)
    except InvalidArgument as exc:  # (argv bytes that aren't UTF-8 come as lone surrogates)
        raise CommandError(str(exc), returncode=USAGE) from None
    except JobNotFound:
        outcome.failed.append(f"{cell(jid)}: no such job waiting, scheduled, retrying or running (it finished, "
                              f"died, or was never pushed)")
        return outcome
    except NotCancellable as exc:
        outcome.failed.append(f"{cell(jid)}: not cancelled: {cell(str(exc), width=1000)}")
        return outcome
    if done == "removed":
        outcome.done.append(f"{cell(jid)}: cancelled (taken off where it waited; it won't run)")
    else:
        outcome.done.append(f"{cell(jid)}: running; " + ("interrupt" if interrupt else "stop")
                            + " requested (its process acts at its next heartbeat)")
    return outcome
