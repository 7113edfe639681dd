"""A kill switch for job classes: a feature of the project's own whose ``before`` hook settles a
job without running it (docs/extending.md).

Named in ``COGWORKER["FEATURES"]`` as ``"testproject.demo.switch.kill_switch"``. An operator
switches a class off with ``SADD <prefix>switched_off <class>`` (``SREM`` to switch it back on):
from then on each job of it a worker fetches is dropped before it runs (acknowledged, logged
with its jid and class, counted as dead by its batch), where a bad release of it would have
failed over and over.
"""

from __future__ import annotations

import logging

from django_cogworker.features import ACK, Decision, Feature, JobRun, Outcome, WorkerParts

logger = logging.getLogger(__name__)


class SwitchedOff(Exception):
    """Why a job was dropped: what the Decision carries, for the ``after`` hooks and the batch."""


class KillSwitch(Feature):
    name = "kill_switch"

    def __init__(self, redis, key: str):
        self.redis = redis
        self.key = key

    def before(self, run: JobRun) -> Decision | None:
        # One round trip per job: read it in a chore() instead, after each heartbeat, if that counts.
        if not self.redis.sismember(self.key, run.payload["class"]):
            return None  # run it
        logger.warning("switched off: %s dropped, never run", run.jid)
        return Decision(Outcome.DEAD, ACK, SwitchedOff(f"{run.shown_class} is switched off"))


def kill_switch(parts: WorkerParts) -> KillSwitch:
    """The factory COGWORKER["FEATURES"] names: called once per worker process with its parts."""
    return KillSwitch(parts.redis, parts.keys.prefix + "switched_off")
