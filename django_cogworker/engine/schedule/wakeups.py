"""The poller's subscription to ``schedule:wake``: due times heard of as they are published.

Every scheduled push publishes its due time on ``schedule:wake``. The poller
subscribes on a connection of its own and waits on it between its sweeps
(``wait``, in slices of at most WAIT_SLICE, so a stop is never kept waiting);
each due time heard is handed to ``expect`` (the due sweep's plan). A
subscription costs Redis nothing while no message comes; it is checked with
one PING per timed round (``after_round``), and redis-py's health check adds
one after 30 s without traffic.

A subscription that is lost (an error reading it, Redis restarting, no answer
to a PING within PONG_TIMEOUT, a refused SUBSCRIBE) only costs precision: the
timed rounds go on, the loss is logged once, and it is subscribed again at
once, then after RESUBSCRIBE_PAUSE, doubling, and after every timed round.
Once subscribed again the poller sweeps: messages were missed meanwhile.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ...broker.keys import Keys
from ...broker.types import RedisClient

logger = logging.getLogger(__name__)

# Longest single wait on the subscription: stop() is never kept waiting longer.
WAIT_SLICE = 0.5
# Seconds of listening without the answer to our PING before the subscription is taken for dead.
PONG_TIMEOUT = 5.0
PING_TOKEN = b"cogworker-poller"
# Pause before subscribing again after a failed attempt: doubling from the first to the second.
RESUBSCRIBE_PAUSE = (1.0, 30.0)


class Wakeups:
    """Hold the subscription to ``schedule:wake`` and hand each due time heard to ``expect``.

    Created by the Poller and used only on its thread (cogworker-poller): ``wait``
    between sweeps (it subscribes when due), ``after_round`` after each timed
    round, ``close`` when the thread ends. No thread of its own; ``stopped`` (the
    poller's stop event) ends a wait within WAIT_SLICE.
    """

    def __init__(self, redis: RedisClient, keys: Keys, expect: Callable[[float], None], clock: Callable[[], float],
                 stopped: threading.Event, timed_every: Callable[[], float]):
        self.redis = redis
        self.keys = keys
        self.expect = expect
        self.clock = clock
        self.stopped = stopped
        self.timed_every = timed_every  # seconds between timed rounds, about: for the log
        self._pubsub: Any = None
        self._ping_waited: float | None = None  # seconds listened since our PING, None: none outstanding
        self._resubscribe_at = 0.0
        self._resubscribe_pause = RESUBSCRIBE_PAUSE[0]
        self._subscribed = False  # the subscription in use has been confirmed
        self._down = False  # logged as down, not yet back

    @property
    def subscribed(self) -> bool:
        """Whether due times published now are heard (False: the timed rounds are relied on)."""
        return self._pubsub is not None and self._subscribed

    def wait(self, until: Callable[[], float]) -> None:
        """Until ``until()`` (monotonic; asked again after each slice, since a message can move it
        earlier), reading the subscription in slices of WAIT_SLICE."""
        self._subscribe_if_due()
        while not self.stopped.is_set():
            left = until() - time.monotonic()
            if left <= 0:
                return
            if self._pubsub is None:
                self.stopped.wait(min(left, WAIT_SLICE))
                self._subscribe_if_due()
            else:
                self._listen(min(left, WAIT_SLICE))

    def _listen(self, timeout: float) -> None:
        started = time.monotonic()
        try:
            message = self._pubsub.get_message(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the timed rounds go on
            self._lose(f"{type(exc).__name__}: {exc}")
            return
        if message is not None:
            self._on_message(message)
        if self._ping_waited is not None:
            self._ping_waited += time.monotonic() - started
            if self._ping_waited > PONG_TIMEOUT:
                self._lose(f"no answer to a PING in {PONG_TIMEOUT:.0f}s")

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        data: Any = message.get("data")  # (anything may be published: checked below)
        if kind == "message":
            try:
                at = float(data)
                if not math.isfinite(at):
                    raise ValueError("not finite")
            except (TypeError, ValueError):
                logger.debug("ignored a message on %s that is not a due time: %.100r", self.keys.schedule_wake, data)
                return
            self.expect(at)
        elif kind == "subscribe":
            self._subscribed = True
            self._resubscribe_pause = RESUBSCRIBE_PAUSE[0]
            if self._down:
                logger.warning("poller: subscribed to %s again", self.keys.schedule_wake)
                self._down = False
            # Due times published while we weren't subscribed were missed: sweep now.
            self.expect(self.clock())
        elif kind == "pong" and data in (PING_TOKEN, PING_TOKEN.decode()):
            self._ping_waited = None

    def after_round(self) -> None:
        """After each timed round: subscribe if we aren't (Redis just answered), else check the
        subscription with a PING (one per round: a dead connection that never said so is noticed
        within a round or two, and one a firewall would drop for idleness is kept alive)."""
        if self._pubsub is None:
            self._resubscribe_at = 0.0
        elif self._ping_waited is None:
            try:
                self._pubsub.ping(PING_TOKEN)
            except Exception as exc:  # noqa: BLE001
                self._lose(f"{type(exc).__name__}: {exc}")
                return
            self._ping_waited = 0.0

    def _subscribe_if_due(self) -> None:
        if self._pubsub is not None or time.monotonic() < self._resubscribe_at:
            return
        pubsub = self.redis.pubsub()
        try:
            pubsub.subscribe(self.keys.schedule_wake)
        except Exception as exc:  # noqa: BLE001 - Redis away, or an ACL without this channel
            _close_quietly(pubsub)
            self._back_off()
            self._report_down(f"could not subscribe to {self.keys.schedule_wake} ({type(exc).__name__}: {exc})")
            return
        self._pubsub = pubsub
        self._subscribed = False
        self._ping_waited = None

    def _lose(self, why: str) -> None:
        _close_quietly(self._pubsub)
        self._pubsub = None
        self._ping_waited = None
        if self._subscribed:
            self._resubscribe_at = 0.0  # at once: a connection cut with Redis still up comes straight back
        else:
            self._back_off()  # never confirmed (refused by an ACL, say): don't retry it in a loop
        self._report_down(f"lost its subscription to {self.keys.schedule_wake} ({why})")

    def _back_off(self) -> None:
        self._resubscribe_at = time.monotonic() + self._resubscribe_pause
        self._resubscribe_pause = min(self._resubscribe_pause * 2, RESUBSCRIBE_PAUSE[1])

    def _report_down(self, what: str) -> None:
        if self._down:
            logger.debug("poller: %s", what)
            return
        self._down = True
        logger.warning("poller: %s; due jobs wait for the timed rounds (every %.0fs or so) until it is back",
                       what, self.timed_every())

    def close(self) -> None:
        _close_quietly(self._pubsub)
        self._pubsub = None


def _close_quietly(pubsub: Any) -> None:
    if pubsub is None:
        return
    try:
        pubsub.close()
    except Exception as exc:  # noqa: BLE001 - closing a broken connection may fail too; it is dropped anyway
        logger.debug("closing the poller's subscription: %s", exc)
