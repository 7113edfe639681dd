"""Looks at Redis that tests assert on, defined once: Redis's clock, the jobs waiting in a queue, and
whether a process left anything of itself behind.

Each name says what it returns; all take a str or a bytes client (json.loads reads either).
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_PREFIX = "cogworker:"


def redis_now(client: Any) -> float:
    """Redis's clock (TIME) in float seconds: what scores, leases and due times are written against.

    Tests compare with it, not with time.time(): the engine reads Redis's clock, and the two may
    differ by the round trip and more on a loaded machine.
    """
    seconds, micros = client.time()
    return seconds + micros / 1_000_000


def queued_payloads(client: Any, queue: str = "default", prefix: str = DEFAULT_PREFIX) -> list[dict]:
    """The payloads waiting in ``queue``, the next to run first (the fetch pops the list's right end)."""
    return [json.loads(raw) for raw in reversed(client.lrange(f"{prefix}queue:{queue}", 0, -1))]


def queued_jids(client: Any, queue: str = "default", prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The jids waiting in ``queue``, the next to run first."""
    return [payload["jid"] for payload in queued_payloads(client, queue, prefix)]


def left_no_trace(client: Any, identity: str, prefix: str = DEFAULT_PREFIX) -> bool:
    """Whether process ``identity`` left nothing of itself (a clean exit): not in the registries, no
    process or workers hash, no last beat, no in-progress list (without a cluster)."""
    p = prefix
    return not (client.sismember(f"{p}processes", identity) or client.exists(f"{p}process:{identity}")
                or client.exists(f"{p}workers:{identity}") or client.sismember(f"{p}in_progress_identities", identity)
                or client.hexists(f"{p}last_beat", identity) or client.exists(f"{p}in_progress:{identity}"))
