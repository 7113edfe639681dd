"""The bench's one model: the rows the iteration section walks (bench/sections/iteration.py).

Not managed: that section creates its table in a database of its own (the ``iter`` alias of
settings.py) and drops the database after; no other database has it.
"""

from django.db import models


class BenchItem(models.Model):
    n = models.IntegerField()
    note = models.TextField()

    class Meta:
        managed = False
        db_table = "bench_iter_item"
