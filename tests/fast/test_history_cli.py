"""``manage.py cogworker metrics`` and ``cogworker mark`` (features/history/cli.py) on the suite's Redis."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_cogworker.broker.keys import Keys
from django_cogworker.engine.loops import redis_time
from django_cogworker.features.history import api
from django_cogworker.features.history.recorder import Recorder

K = Keys()


def cli(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("cogworker", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def counted(rb, runs: list[tuple[str, float, bool]]) -> None:
    """``runs`` (class, seconds, failed) counted now, as a worker would, and flushed."""
    rec = Recorder(K)
    rec.anchor(redis_time(rb))
    for job_class, seconds, failed in runs:
        rec.record("default", job_class, seconds, failed)
    rec.flush(rb)


def test_metrics_json_gives_each_class_its_counts_percentiles_and_total(rb):
    counted(rb, [("shop.Sync", 0.2, False)] * 3 + [("shop.Sync", 0.2, True)] * 2 + [("shop.Ping", 0.003, False)])
    document = json.loads(cli("metrics", "--minutes", "5", "--json")[0])
    assert document["minutes"] == 5 and document["resolution_seconds"] == 60
    assert document["classes"]["shop.Sync"] == {"processed": 5, "failed": 2, "ms_p50": 175.0, "ms_p95": 242.5,
                                                "ms_p99": 248.5, "ms_mean": 200.0, "ms_total": 1000.0}
    assert list(document["classes"]) == ["shop.Sync", "shop.Ping"]
    only = json.loads(cli("metrics", "--class", "shop.Ping", "--json")[0])
    assert list(only["classes"]) == ["shop.Ping"] and only["minutes"] == 60
    by_hour = json.loads(cli("metrics", "--minutes", "1440", "--json")[0])
    assert by_hour["resolution_seconds"] == 3600 and by_hour["classes"]["shop.Sync"]["processed"] == 5


def test_metrics_table_names_odd_classes_on_one_line_and_says_when_nothing_ran(rb):
    counted(rb, [("two\nlines", 0.01, False)])
    out, _err = cli("metrics")
    assert "two\\nlines" in out and len(out.strip().splitlines()) == 2
    _out, err = cli("metrics", "--class", "shop.Nothing")
    assert "no runs counted in the last 60 minute(s) for shop.Nothing" in err


def test_mark_stores_a_deploy_mark_that_metrics_json_shows(rb):
    out, _err = cli("mark", "deploy 1.4.2", "--skip-checks")
    assert out.startswith("marked deploy 1.4.2 at ")
    assert [m["label"] for m in json.loads(cli("metrics", "--json")[0])["marks"]] == ["deploy 1.4.2"]
    assert [m.label for m in api.marks(0, 2e9, redis=rb, keys=K)] == ["deploy 1.4.2"]
    with pytest.raises(CommandError, match="a mark needs a label"):
        cli("mark", "  ", "--skip-checks")
    with pytest.raises(CommandError):
        cli("metrics", "--minutes", "0")
