"""The error of an iterable job that can't iterate as written: a CogworkerError, filed as any failure.

Raised at its first iteration (not at its push: the enumerator is the job's own code, run by the
worker), naming what is wrong: an enumerator that yields something other than ``(item, cursor)``
pairs, a cursor JSON can't hold, a ``perform`` defined on an IterableJob, a cursor saved in a form
this job can't read. The job fails as any job does (retry, then dead).
"""

from __future__ import annotations

from ...errors import CogworkerError


class IterationError(CogworkerError):
    """An iterable job that can't iterate as written (see the module's header)."""
