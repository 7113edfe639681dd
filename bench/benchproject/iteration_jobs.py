"""The iteration section's jobs (bench/sections/iteration.py): one IterableJob walking every row of
``BenchItem`` (the ``iter`` database) by its queryset enumerator, in three checkpoint settings.

Imported by that section only (not by the workers' ``jobs.py``): a job class of an installed app's
module, so pushing it is allowed.
"""

from django_cogworker import IterableJob

from .models import BenchItem

ALIAS = "iter"
SINK = [0, 0]  # (the sum of a column, the rows counted)


def consume(item, sink=SINK):
    """What every way of the section does with a row: reads a column (the floor of any real work)."""
    sink[0] += item.n
    sink[1] += 1


class IterRows(IterableJob):
    """Checkpointed every ITERATION_CHECKPOINT (1 s by default)."""

    name = "bench.IterRows"

    def build_enumerator(self, cursor=None):
        return self.queryset_enumerator(BenchItem.objects.using(ALIAS).all(), cursor=cursor)

    def each_iteration(self, item):
        consume(item)


class IterRowsUnsaved(IterRows):
    """No checkpoint while it walks (a day between two): the cursor saved only at the run's start and end."""

    name = "bench.IterRowsUnsaved"
    iteration_checkpoint = 86400


class IterRowsEveryItem(IterRows):
    """A checkpoint after every item: a Redis round trip each."""

    name = "bench.IterRowsEveryItem"
    checkpoint_every = 1
