"""How ``manage.py cogworker`` prints: aligned tables under column headers, or one JSON document.

Cells hold what anyone could push (queue names, arguments, error messages), so a table escapes
control characters (a queue named with an ANSI escape or a newline must not repaint the
operator's terminal or fake a row) and cuts long cells; ``--json`` gives the values whole, as
the api read them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Sequence
from typing import Any

CELL_WIDTH = 60  # characters of a table cell shown at most (arguments, errors)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Exit codes: 0 done; FAILED: something named isn't there or was refused (the rest was done);
# USAGE: the command line itself was wrong (argparse's own code), e.g. a bulk action without --yes.
FAILED = 1
USAGE = 2


def cell(value: Any, width: int = CELL_WIDTH) -> str:
    """One table cell: text without control characters, at most ``width`` characters."""
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, separators=(",", ":"), default=str)
    text = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # (a lone surrogate)
    return text if len(text) <= width else text[:width - 1] + "…"


def when(epoch: float | None) -> str:
    """An epoch time as UTC text, to the second; "-" for none."""
    if epoch is None or not math.isfinite(epoch):
        return "-"
    try:
        return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # (a year Python's datetime can't hold)
        return "-"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The rows under their headers, columns padded to their widest cell, the last one not."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = [v.ljust(w) for v, w in zip(values[:-1], widths[:-1], strict=True)]
        return "  ".join([*padded, values[-1]]).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def as_json(document: Any) -> str:
    """``document`` as JSON text: what can't be JSON (infinity in a stored payload) as a string."""
    return json.dumps(_jsonable(document), indent=2, ensure_ascii=False, default=str)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def listing(items: list[dict[str, Any]], *, page: int, per_page: int, total: int,
            complete: bool = True) -> dict[str, Any]:
    """The JSON document of a listing: its items and where they sit in the whole (``per_page``: the
    page size used, never the count shown: a listing of one process said 1, of none 0)."""
    return {"total": total, "page": page, "per_page": per_page, "complete": complete, "items": items}


def more_note(page: int, per_page: int, total: int, shown: int) -> str | None:
    """The line that says a listing was cut, and how to see the rest; None when it shows all."""
    first = (page - 1) * per_page
    if shown and first + shown >= total and page == 1:
        return None
    if not shown:
        return f"(nothing on page {page}; {total} in all)" if total else None
    pages = max(math.ceil(total / per_page), 1)
    return (f"({first + 1}-{first + shown} of {total}, page {page} of {pages}"
            + (f"; --page {page + 1} for more)" if page < pages else ")"))
