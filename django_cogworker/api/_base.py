"""What several parts of the object model share: the scan hint and page size, the refusal error,
and the small readers (defaults from the runtime, lenient text and number, glob escaping, page clamping).

SCAN_COUNT is read as ``_base.SCAN_COUNT`` by the modules that scan (``sorted_sets``, ``quarantine``),
so a test that patches it here changes every scan, as one constant should.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import CogworkerError
from ..keys import Keys, glob_escape

SCAN_COUNT = 1_000  # the COUNT hint of each ZSCAN / SCAN call
MAX_PER_PAGE = 500


class ActionRefused(CogworkerError):
    """An action that can't be done on this object (an entry that names no queue, a key that exists)."""


def _defaults(redis: Any, keys: Keys | None) -> tuple[Any, Keys]:
    if redis is None or keys is None:
        from .. import runtime

        redis = redis if redis is not None else runtime.get_redis()
        keys = keys if keys is not None else Keys(runtime.get_config().key_prefix)
    return redis, keys


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, bytes)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


_glob_escape = glob_escape


def _clamp_page(page: int, per_page: int) -> tuple[int, int]:
    return max(int(page), 1), min(max(int(per_page), 1), MAX_PER_PAGE)

