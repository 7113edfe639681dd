"""The enumerators an IterableJob's ``build_enumerator`` returns: iterables of ``(item, cursor)``
pairs, each resuming after the cursor it is given (the cursor of the last item done; None: from the
start). Each knows its length (``len()``: items in all, not those left), which the loop reports as
the job's progress total.

* :class:`ListEnumerator`: a list's items; cursor: the index of the item.
* :class:`RangeEnumerator`: a range's numbers; cursor: the number.
* :class:`QuerySetEnumerator`: a Django QuerySet's rows, by keyset (``WHERE key > cursor ORDER BY
  key LIMIT n``, never OFFSET: each page costs the same however far in); cursor: the last row's key
  value(s). With ``batches=True``, each item is a list of up to ``batch_size`` rows.
* :class:`CsvEnumerator`: a CSV file's rows (dicts with ``header``, else lists); cursor: the row's
  number (0 for the first data row). A resumed run reads past the rows done (a file can't be
  entered by row without reading it; a byte offset would not survive a quoted newline split by a
  reader's buffering).

Length costs: a list's and a range's nothing; a QuerySet's one ``COUNT(*)`` (asked once per run,
only when something reads it); a CSV file's one read through it.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ...bounds import check_size
from ...errors import InvalidArgument

DEFAULT_BATCH = 100  # rows a QuerySet enumerator reads per query


class ListEnumerator:
    def __init__(self, items: Sequence[Any], cursor: int | None = None):
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise InvalidArgument(f"list_enumerator takes a list (a sequence), got {type(items).__name__}")
        self.items = items
        self.start = _next_index(cursor, "list_enumerator")

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        items = self.items
        for index in range(self.start, len(items)):
            yield items[index], index


class RangeEnumerator:
    def __init__(self, start: int, stop: int | None = None, step: int = 1, cursor: int | None = None):
        full = range(start) if stop is None else range(start, stop, step)
        if cursor is not None and not (isinstance(cursor, int) and not isinstance(cursor, bool)):
            raise InvalidArgument(f"range_enumerator's cursor must be a number of the range, got {cursor!r}")
        self.full = full
        self.left = full if cursor is None else range(cursor + full.step, full.stop, full.step)

    def __len__(self) -> int:
        return len(self.full)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for number in self.left:
            yield number, number


def _next_index(cursor: Any, who: str) -> int:
    if cursor is None:
        return 0
    if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
        raise InvalidArgument(f"{who}'s cursor must be an index (an int >= 0), got {cursor!r}")
    return cursor + 1


class QuerySetEnumerator:
    """A QuerySet walked by keyset on ``keys`` (default: the primary key), ``batch_size`` rows a query.

    ``keys`` must be non-null fields of the model (a leading "-" walks one descending); the primary
    key is added last when absent, so that rows with equal keys are told apart and none is skipped
    or read twice. The cursor is the last row's key value (one key) or values (a list), in a form
    JSON holds (a UUID or a Decimal as text, a date or a datetime in ISO 8601), which the database
    compares as the field's own type.
    """

    def __init__(self, queryset: Any, cursor: Any = None, *, keys: Sequence[str] = ("pk",),
                 batch_size: int = DEFAULT_BATCH, batches: bool = False):
        if isinstance(keys, str):
            keys = (keys,)
        if not keys:
            raise InvalidArgument("queryset_enumerator's keys must name at least one field")
        self.batch_size = check_size(batch_size, "queryset_enumerator's batch_size")
        meta = queryset.model._meta
        pk = meta.pk.name
        names = [k.lstrip("-") for k in keys]
        if not {"pk", pk} & set(names):
            keys = (*keys, "pk")
        self.keys = tuple(keys)
        self.fields = tuple(meta.pk.attname if k.lstrip("-") in ("pk", pk) else meta.get_field(k.lstrip("-")).attname
                            for k in self.keys)
        self.descending = tuple(k.startswith("-") for k in self.keys)
        self.queryset = queryset.order_by(*self.keys)
        self.batches = batches
        if cursor is not None:
            cursor = [cursor] if len(self.keys) == 1 else cursor
            if not isinstance(cursor, list) or len(cursor) != len(self.keys):
                raise InvalidArgument(f"queryset_enumerator's cursor must hold {len(self.keys)} key value(s) "
                                      f"({', '.join(self.keys)}), got {cursor!r}")
        self.after = cursor
        self._count: int | None = None

    def __len__(self) -> int:
        if self._count is None:
            count = self.queryset.count()
            self._count = -(-count // self.batch_size) if self.batches else count
        return self._count

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        after = self.after
        while True:
            page = list(self._page(after)[:self.batch_size])
            if not page:
                return
            if self.batches:
                after = self._values(page[-1])
                yield page, self._cursor(after)
            else:
                for row in page:
                    after = self._values(row)
                    yield row, self._cursor(after)
            if len(page) < self.batch_size:
                return

    def _page(self, after: list[Any] | None) -> Any:
        """The rows after ``after`` in key order: (k1 > a1) OR (k1 = a1 AND k2 > a2) OR ..."""
        if after is None:
            return self.queryset
        from django.db.models import Q

        condition = Q()
        for i, (field, value) in enumerate(zip(self.fields, after, strict=True)):
            step = Q(**{f"{field}__{'lt' if self.descending[i] else 'gt'}": value})
            for earlier, earlier_value in zip(self.fields[:i], after[:i], strict=True):
                step &= Q(**{earlier: earlier_value})
            condition |= step
        return self.queryset.filter(condition)

    def _values(self, row: Any) -> list[Any]:
        return [_json_value(getattr(row, field)) for field in self.fields]

    def _cursor(self, values: list[Any]) -> Any:
        return values[0] if len(values) == 1 else list(values)


def _json_value(value: Any) -> Any:
    """A key value as JSON holds it, in a form the database compares as the field's type."""
    if value is None:
        raise InvalidArgument("queryset_enumerator's keys must be non-null fields: a row has None for one")
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    return value


class CsvEnumerator:
    """A CSV file's rows: dicts keyed by its header row (``header=True``), else lists of text."""

    def __init__(self, path: Any, cursor: int | None = None, *, header: bool = True, encoding: str = "utf-8",
                 **dialect: Any):
        self.path = path
        self.header = header
        self.encoding = encoding
        self.dialect = dialect
        self.start = _next_index(cursor, "csv_enumerator")
        self._count: int | None = None

    def _rows(self, f: Any) -> Iterator[Any]:
        return csv.DictReader(f, **self.dialect) if self.header else csv.reader(f, **self.dialect)

    def __len__(self) -> int:
        if self._count is None:
            with open(self.path, newline="", encoding=self.encoding) as f:
                self._count = sum(1 for _ in self._rows(f))
        return self._count

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        with open(self.path, newline="", encoding=self.encoding) as f:
            for number, row in enumerate(self._rows(f)):
                if number >= self.start:
                    yield row, number
