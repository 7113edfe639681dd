"""The enumerators of iterable jobs (django_cogworker/features/iteration/enumerators.py): each yields
(item, cursor) pairs, resumes right after the cursor it is given (nothing twice, nothing left out),
and knows its length. The QuerySet ones on SQLite ("default") and PostgreSQL ("pg"), walked by
keyset: no query has an OFFSET, each page starts after the last row's key.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_cogworker.errors import InvalidArgument
from django_cogworker.features.iteration.enumerators import (
    CsvEnumerator,
    ListEnumerator,
    QuerySetEnumerator,
    RangeEnumerator,
)
from testproject.demo.models import Receipt


def walk_in_two(make, split: int) -> list:
    """The items of an enumerator walked up to ``split``, then of a new one resumed from the cursor
    saved there (through JSON, as it is stored)."""
    first = make(None)
    items, cursor = [], None
    for pair in first:
        items.append(pair[0])
        cursor = pair[1]
        if len(items) == split:
            break
    return items + [item for item, _ in make(json.loads(json.dumps(cursor)))]


def test_a_list_resumes_after_the_index_of_its_cursor():
    letters = list("abcdef")
    assert list(ListEnumerator(letters)) == [(c, i) for i, c in enumerate(letters)]
    assert walk_in_two(lambda cursor: ListEnumerator(letters, cursor), 2) == letters
    assert len(ListEnumerator(letters, 3)) == 6  # (all its items: the progress total)
    assert list(ListEnumerator(letters, 5)) == []


def test_a_range_resumes_after_the_number_of_its_cursor():
    assert list(RangeEnumerator(3)) == [(0, 0), (1, 1), (2, 2)]
    assert walk_in_two(lambda cursor: RangeEnumerator(10, 40, 7, cursor), 2) == list(range(10, 40, 7))
    assert len(RangeEnumerator(10, 40, 7, cursor=17)) == 5


@pytest.mark.parametrize("cursor", [-1, "2", 1.5, True])
def test_a_cursor_that_is_no_index_is_refused_naming_it(cursor):
    with pytest.raises(InvalidArgument, match="cursor must be an index"):
        ListEnumerator([1, 2], cursor)


def test_a_csv_file_resumes_after_the_row_of_its_cursor(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('name,note\nann,"two\nlines"\nbob,x\ncid,y\n')

    rows = walk_in_two(lambda cursor: CsvEnumerator(path, cursor), 1)

    assert rows == [{"name": "ann", "note": "two\nlines"}, {"name": "bob", "note": "x"}, {"name": "cid", "note": "y"}]
    assert len(CsvEnumerator(path)) == 3
    assert [row for row, _ in CsvEnumerator(path, cursor=0, header=False)] == [["ann", "two\nlines"], ["bob", "x"],
                                                                                ["cid", "y"]]


# -- QuerySets ---------------------------------------------------------------------------------------

DATABASES = ["default", "pg"]


@pytest.fixture(params=DATABASES)
def alias(request):
    return request.param


def receipts(alias: str, orders: list[int]) -> list[Receipt]:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [Receipt.objects.using(alias).create(order_id=order, sent_at=at + dt.timedelta(minutes=i))
            for i, order in enumerate(orders)]


@pytest.mark.django_db(databases=DATABASES)
def test_a_queryset_is_walked_by_primary_key_without_offset(alias):
    rows = receipts(alias, list(range(7)))
    queryset = Receipt.objects.using(alias).all()

    with CaptureQueriesContext(connections[alias]) as queries:
        walked = walk_in_two(lambda cursor: QuerySetEnumerator(queryset, cursor, batch_size=3), 4)

    assert [r.pk for r in walked] == [r.pk for r in rows]
    sql = [q["sql"].upper() for q in queries.captured_queries]
    assert sql and not any("OFFSET" in s for s in sql)
    assert len(QuerySetEnumerator(queryset)) == 7
    first, _ = next(iter(QuerySetEnumerator(queryset, rows[4].pk)))
    assert first.pk == rows[5].pk  # (its cursor: the primary key of the last row done)


@pytest.mark.django_db(databases=DATABASES)
def test_a_queryset_walked_by_a_key_that_repeats_skips_no_row_and_repeats_none(alias):
    rows = receipts(alias, [3, 1, 3, 2, 1, 3, 2])
    queryset = Receipt.objects.using(alias).filter(order_id__gte=1)

    for split in range(1, 7):
        walked = walk_in_two(lambda cursor: QuerySetEnumerator(queryset, cursor, keys=("order_id",), batch_size=2),
                             split)
        assert sorted(r.pk for r in walked) == sorted(r.pk for r in rows)
        assert [r.order_id for r in walked] == sorted(r.order_id for r in rows)
    _row, cursor = next(iter(QuerySetEnumerator(queryset, keys=("order_id",))))
    assert cursor == [1, rows[1].pk]  # (the key, and the primary key that tells equal keys apart)


@pytest.mark.django_db(databases=DATABASES)
def test_a_queryset_walked_by_a_descending_datetime(alias):
    rows = receipts(alias, [5, 6, 7, 8])
    queryset = Receipt.objects.using(alias).all()

    walked = walk_in_two(lambda cursor: QuerySetEnumerator(queryset, cursor, keys=("-sent_at",), batch_size=3), 2)

    assert [r.pk for r in walked] == [r.pk for r in reversed(rows)]


@pytest.mark.django_db(databases=DATABASES)
def test_a_queryset_in_batches_gives_lists_and_counts_them(alias):
    rows = receipts(alias, list(range(7)))
    queryset = Receipt.objects.using(alias).all()

    batches = walk_in_two(lambda cursor: QuerySetEnumerator(queryset, cursor, batch_size=3, batches=True), 1)

    assert [[r.pk for r in batch] for batch in batches] == [[r.pk for r in rows[i:i + 3]] for i in (0, 3, 6)]
    assert len(QuerySetEnumerator(queryset, batch_size=3, batches=True)) == 3


@pytest.mark.django_db(databases=DATABASES)
def test_a_cursor_of_the_wrong_shape_is_refused_naming_the_keys(alias):
    with pytest.raises(InvalidArgument, match=r"2 key value\(s\) \(order_id, pk\)"):
        QuerySetEnumerator(Receipt.objects.using(alias).all(), 5, keys=("order_id",))
