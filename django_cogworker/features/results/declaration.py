"""What the results feature declares (django_cogworker/declarations.py): the class options it reads.

``result_ttl``: seconds to keep a job's result record (status, return value, errors; writer.py)
after its last change; None: no record, and nothing paid for one. ``timeout``: seconds a run may
take before JobTimeout is raised in it (engine/run/timeouts.py, armed by hook.py); None: no limit.
"""

from __future__ import annotations

from typing import Any

from ...bounds import check_seconds
from ...declarations import Declaration, Option


def _seconds(value: Any, where: str) -> Any:
    check_seconds(value, where)
    return value


DECLARATION = Declaration("results", options=(Option("result_ttl", None, _seconds), Option("timeout", None, _seconds)))
