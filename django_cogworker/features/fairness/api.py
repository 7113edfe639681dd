"""A queue's groups for the admin, the CLI and a shell (``api.Queue(q).groups()``, ``pause_group``,
``resume_group``: the core's Queue reaches these through what declaration.py provides).

The groups are counted in Redis (api/lanes.py, broker/scripts/lane_sizes.py: one script call a queue
walks its ring and paused set, sums the lists' lengths and keeps the busiest) and shown the busiest
first, a page at a time with their total: page 1 of a queue of 100,000 tenants is ten script calls
of a few milliseconds each, whose replies hold 25 groups each (page N: N x 25). A lane key of the wrong type is
shown as poisoned ("holds another type"), never raised: the key guard moves it aside.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ...api._base import ActionRefused, _clamp_page
from ...api.records import Page
from ...broker.keys import Want
from ...broker.quarantine import run_script
from . import scripts
from .options import group_id


@dataclasses.dataclass
class QueueGroup:
    """One group of a queue: its id, its jobs waiting, whether it is paused, and what its list
    holds instead of jobs when it is of the wrong type (None: nothing wrong)."""

    id: str
    waiting: int
    paused: bool
    poisoned: str | None = None


@dataclasses.dataclass
class GroupPage:
    """A page of a queue's groups (``page``), with what the queue's lanes hold as a whole."""

    page: Page
    groups: int  # every group of the queue (waiting or paused)
    grouped: int  # jobs waiting in its groups
    prioritized: int  # jobs waiting with a priority
    poisoned: list[str]  # its lane keys of the wrong type ("ring (holds another type)", ...)


def queue_groups(queue: Any, page: int = 1, per_page: int = 25) -> GroupPage:
    """``Queue.groups``: the groups, the busiest first (then by id)."""
    page, per_page = _clamp_page(page, per_page)
    start = (page - 1) * per_page
    lanes = queue.lanes(busiest=start + per_page)  # (page 1: the 25 busiest, picked in Redis)
    rows = [QueueGroup(g.id.decode("utf-8", "backslashreplace"), g.waiting, g.paused, g.poisoned)
            for g in lanes.busiest[start:start + per_page]]
    return GroupPage(Page(rows, page, per_page, lanes.group_count), lanes.group_count, lanes.grouped,
                     lanes.prioritized, list(lanes.poisoned))


def _keys(queue: Any, group: str | int) -> tuple[str, Any]:
    if not queue.readable:
        raise ActionRefused(f"queue {queue.name!r}: a name that isn't UTF-8 has no groups (a push refuses it)")
    return group_id(group, f"queue {queue.name}: group"), queue.keys.lanes(queue.name)


def pause_group(queue: Any, group: str | int) -> bool:
    """``Queue.pause_group``: its jobs stay where they wait, and none is fetched until resumed (the
    fetches under way may still take one); True if it wasn't paused."""
    gid, lanes = _keys(queue, group)
    return bool(run_script(scripts.PAUSE_GROUP, queue.redis, queue.keys, [lanes.paused, lanes.ring], [gid],
                           lanes.expected()))


def resume_group(queue: Any, group: str | int) -> bool:
    """``Queue.resume_group``: its waiting jobs take turns again; True if it was paused."""
    gid, lanes = _keys(queue, group)
    queue_key = queue.keys.queue(queue.name)
    bell = json.dumps({"lane": "bell", "queue": queue.name}, separators=(",", ":"))
    expected = {**lanes.expected(), lanes.group(gid): Want("list"), queue_key: Want("list")}
    return bool(run_script(scripts.RESUME_GROUP, queue.redis, queue.keys,
                           [lanes.paused, lanes.ring, lanes.group(gid), queue_key], [gid, bell], expected))
