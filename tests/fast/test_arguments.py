"""arguments.check_json_native: what a job may be sent, and the error naming what it may not."""

from __future__ import annotations

import collections
import enum

import pytest

from django_cogworker.push.arguments import check_json_native


class _Kind(enum.IntEnum):
    ONE = 1


class _Text(str):
    pass


@pytest.mark.parametrize(("value", "where"), [
    ((1, 2), "args[0]"), ({1, 2}, "args[0]"), (b"raw", "args[0]"), (float("nan"), "args[0]"),
    (float("-inf"), "args[0]"), ([1, {"k": (2,)}], "args[0][1]['k']"), ({3: "x"}, "args[0]"),
])
def test_check_json_native_names_the_path(value, where):
    with pytest.raises(TypeError) as info:
        check_json_native([value], "args")
    assert str(info.value).startswith(where + " ")


def test_check_json_native_accepts_json_types():
    check_json_native([None, True, 1, 2**70, 1.5, "s", [], {}, {"a": [1, {"b": None}]}], "args")


@pytest.mark.parametrize("value", [
    _Kind.ONE, _Text("s"), collections.OrderedDict(a=1), {"k": _Text("v")}, [[_Kind.ONE]], 1e308, -0.0,
], ids=["IntEnum", "str subclass", "OrderedDict", "subclass in dict", "nested IntEnum", "large float", "-0.0"])
def test_check_json_native_still_accepts_what_the_full_walk_accepts(value):
    check_json_native([value], "args")
    check_json_native({"k": value}, "kwargs")


@pytest.mark.parametrize(("value", "where"), [
    ({"a": [1, {"b": float("nan")}]}, "kwargs['a'][1]['b']"), ({"a": (1,)}, "kwargs['a']"),
    ({"a": {1: 2}}, "kwargs['a']"), ({"a": _Text("ok"), "b": {1.5}}, "kwargs['b']"),
])
def test_check_json_native_names_the_path_in_kwargs(value, where):
    with pytest.raises(TypeError) as info:
        check_json_native(value, "kwargs")
    assert str(info.value).startswith(where + " ")
