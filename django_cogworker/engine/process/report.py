"""What a supervised worker process tells its supervisor, one byte at a time, through a pipe.

The supervisor holds no Redis connection (its children are forked from it: redis-py's pools are
not fork-safe), yet it decides when an old process may be retired (once its replacement is
ready) and answers the health probes for all of them. Each child writes, on the pipe the
supervisor made for it: READY once it has beaten and started its processors, BEAT at each good
heartbeat, QUIET once it takes nothing new; after READY, UNREADY when its fetcher's round trips
to Redis fail while its beats go through, READY again when they don't (a beat that fails sends
nothing: the supervisor sees the silence). A byte is atomic on a pipe, and the supervisor's
select loop reads them as they come; a full pipe (a supervisor stuck) drops bytes, never blocks
a worker.

WORKED is said once, as the first job starts: a supervisor replaces a process that exits to be
replaced (a cap) at once only if it ran something. REFUSED is the one message with text: the
marker, why the process refuses to run (caps.REFUSE_EXIT), a newline, in one write (atomic under
PIPE_BUF), its last; the supervisor stops with that text (``split_refusal``).
"""

from __future__ import annotations

import contextlib
import os

READY, BEAT, QUIET, UNREADY = b"r", b"b", b"q", b"u"
WORKED, REFUSED = b"w", b"!"
REFUSAL_MAX = 2048  # bytes of a refusal's text (a pipe write up to PIPE_BUF, 4096 on Linux, is atomic)


def split_refusal(data: bytes) -> tuple[bytes, str | None]:
    """``data`` without a refusal's text (whose letters are no messages), and that text, or None."""
    head, marker, tail = data.partition(REFUSED)
    if not marker:
        return data, None
    text, _, after = tail.partition(b"\n")
    return head + after, text.decode(errors="replace")


class Reporter:
    """The child's end: created by ``runcogworker`` for a supervised process; None-safe to share.

    Called from the main thread (``ready``, ``quiet``) and the heartbeat thread (``beat``, ``able``): each is
    one ``write`` of one byte, which needs no lock.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self._able = True  # (as READY says)
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

    def worked(self) -> None:
        """As the first job starts (on its processor's thread: Caps.on_first_job)."""
        self._send(WORKED)

    def refuse(self, why: str) -> None:
        """Why this process won't run (the main thread, before it exits with caps.REFUSE_EXIT)."""
        self._send(REFUSED + " ".join(why.split()).encode()[:REFUSAL_MAX] + b"\n")

    def able(self, can_fetch: bool) -> None:
        """Whether it can fetch (the heartbeat's thread, after READY); said when it changes."""
        if can_fetch != self._able:
            self._able = can_fetch
            self._send(READY if can_fetch else UNREADY)
