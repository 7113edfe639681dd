"""IterableJob: a job that walks an enumerator item by item, saving its cursor, so that a TERM, a
kill -9, a retry or a throttle never has it start over (docs/jobs.md, "Long jobs")::

    class Reindex(IterableJob):
        def build_enumerator(self, shop_id, cursor=None):
            return self.queryset_enumerator(Product.objects.filter(shop_id=shop_id), cursor=cursor)

        def each_iteration(self, product, shop_id):
            index(product)

``build_enumerator(*args, cursor=None, **kwargs)`` returns an iterable of ``(item, cursor)`` pairs
that resumes after ``cursor`` (JSON: the cursor of the last item done, None at the start);
``each_iteration(item, *args, **kwargs)`` does one item. ``perform`` is IterableJob's own (the
loop, loop.py): a class that defines one is refused at its first run. Hooks, each a no-op unless
overridden: ``on_start`` (its first run), ``on_resume`` (every later one), ``on_stop`` (each run
that ends without an error: interrupted, throttled, completed or cancelled), ``on_complete``,
``on_cancel``. ``self.cursor`` is the cursor of the last item done (what a new run resumes after),
``self.executions`` this run's number (1 for the first).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from ...push import scope as _scope
from ...push.job import Job
from . import enumerators
from .loop import NAME, iterate

logger = logging.getLogger(__name__)


class IterableJob(Job):
    """Base of an iterable job (see the module's header). Its options, beside every job's:
    ``iteration_checkpoint``, ``checkpoint_every``, ``max_iteration_runtime``, ``throttle_on``
    (declaration.py)."""

    _cogworker_iterable: ClassVar[bool] = True
    # Why a class can't run (it defines perform): raised at its first run, as its failure.
    _iteration_problem: ClassVar[str] = ""
    cursor: Any = None
    executions: int = 0

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "perform" in cls.__dict__:
            cls._iteration_problem = (
                f"{cls.__module__}.{cls.__qualname__} defines perform(), which an IterableJob must not: define "
                f"build_enumerator(*args, cursor=None) and each_iteration(item, *args) instead (IterableJob's "
                f"perform is the loop over the enumerator)")
            logger.warning("%s; its jobs fail at their first run", cls._iteration_problem)
            cls.perform = IterableJob.perform  # type: ignore[method-assign]
        else:
            cls._iteration_problem = ""

    def perform(self, *args: Any, **kwargs: Any) -> None:
        running = _scope.running.get()
        run = running.extras.get(NAME) if running is not None and running.payload is self.payload else None
        iterate(self, args, kwargs, run)

    # -- what a subclass defines ---------------------------------------------------------

    def build_enumerator(self, *args: Any, cursor: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.build_enumerator is not defined: an IterableJob returns "
                                  f"an iterable of (item, cursor) pairs from it")

    def each_iteration(self, item: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__}.each_iteration is not defined: an IterableJob does one "
                                  f"item in it")

    def on_start(self) -> None:
        """Its first run begins (not called again when it resumes)."""

    def on_resume(self) -> None:
        """A later run begins, from ``self.cursor``."""

    def on_stop(self) -> None:
        """A run ends without an error: interrupted (TERM, max_iteration_runtime), throttled, completed or
        cancelled (called before ``on_complete`` and ``on_cancel``)."""

    def on_complete(self) -> None:
        """Every item is done."""

    def on_cancel(self) -> None:
        """It was cancelled (``Job.cancel``): it stopped at the next item."""

    # -- enumerators -------------------------------------------------------------------

    def list_enumerator(self, items: Sequence[Any], *, cursor: int | None = None) -> enumerators.ListEnumerator:
        """``items`` one by one; the cursor is the index of the item."""
        return enumerators.ListEnumerator(items, cursor)

    array_enumerator = list_enumerator  # (Sidekiq's name)

    def range_enumerator(self, start: int, stop: int | None = None, step: int = 1, *,
                         cursor: int | None = None) -> enumerators.RangeEnumerator:
        """The numbers of ``range(start, stop, step)``; the cursor is the number."""
        return enumerators.RangeEnumerator(start, stop, step, cursor)

    def queryset_enumerator(self, queryset: Any, *, cursor: Any = None, keys: Sequence[str] = ("pk",),
                            batch_size: int = enumerators.DEFAULT_BATCH) -> enumerators.QuerySetEnumerator:
        """The rows of ``queryset`` one by one, walked by keyset on ``keys`` (unique with the primary
        key added; never OFFSET), ``batch_size`` a query; the cursor is the last row's key value(s)."""
        return enumerators.QuerySetEnumerator(queryset, cursor, keys=keys, batch_size=batch_size)

    def queryset_batches_enumerator(self, queryset: Any, *, cursor: Any = None, keys: Sequence[str] = ("pk",),
                                    batch_size: int = enumerators.DEFAULT_BATCH) -> enumerators.QuerySetEnumerator:
        """The rows of ``queryset`` in lists of up to ``batch_size`` (one item each), by keyset as
        :meth:`queryset_enumerator`; the cursor is the last row's key value(s) of each list."""
        return enumerators.QuerySetEnumerator(queryset, cursor, keys=keys, batch_size=batch_size, batches=True)

    def csv_enumerator(self, path: Any, *, cursor: int | None = None, header: bool = True, encoding: str = "utf-8",
                       **dialect: Any) -> enumerators.CsvEnumerator:
        """The rows of the CSV file at ``path`` (dicts by its header row; lists with ``header=False``);
        the cursor is the row's number (0: the first data row)."""
        return enumerators.CsvEnumerator(path, cursor, header=header, encoding=encoding, **dialect)
