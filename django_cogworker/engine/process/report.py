"""What a supervised worker process tells its supervisor, one byte at a time, through a pipe.

The supervisor holds no Redis connection (its children are forked from it: redis-py's pools are
not fork-safe), yet it decides when an old process may be retired (once its replacement is
ready) and answers the health probes for all of them. Each child writes, on the pipe the
supervisor made for it: READY once it has beaten and started its processors, BEAT at each good
heartbeat, QUIET once it takes nothing new. A byte is atomic on a pipe, and the supervisor's
select loop reads them as they come; a full pipe (a supervisor stuck) drops bytes, never blocks
a worker.
"""

from __future__ import annotations

import contextlib
import os

READY, BEAT, QUIET = b"r", b"b", b"q"


class Reporter:
    """The child's end: created by ``runcogworker`` for a supervised process; None-safe to share.

    Called from the main thread (``ready``, ``quiet``) and the heartbeat thread (``beat``): each is
    one ``write`` of one byte, which needs no lock.
    """

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)

    def _send(self, byte: bytes) -> None:
        # (BlockingIOError: the supervisor isn't reading, drop it; BrokenPipeError: it is gone, and
        # this process gets its TERM from the kernel: see children.die_with_parent)
        with contextlib.suppress(OSError):
            os.write(self.fd, byte)

    def ready(self) -> None:
        self._send(READY)

    def beat(self) -> None:
        self._send(BEAT)

    def quiet(self) -> None:
        self._send(QUIET)
