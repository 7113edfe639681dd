"""payload: encode/decode, the cautious reading of ``retry``, and error text that never raises."""

from __future__ import annotations

import json

import pytest

from django_cogworker import PayloadError
from django_cogworker import payload as payloads
from testproject.demo.jobs import BadStrError

DEFAULT = 25


@pytest.mark.parametrize(("value", "expected"), [
    (None, DEFAULT), (True, DEFAULT), (False, 0),
    (0, 0), (3, 3), (-2, 0),
    (2.7, 2), (-1.5, 0), (float("nan"), 0), (float("inf"), 0),
    ("3", 3), (" 4 ", 4), ("-3", 0), ("abc", 0), ("", 0), ("2.5", 0),
    ({}, 0), ([], 0), ({"n": 3}, 0),
])
def test_max_retries_reads_any_value_without_raising(value, expected):
    assert payloads.max_retries(value, DEFAULT) == expected


def test_max_retries_uses_the_default_given():
    assert payloads.max_retries(True, 7) == 7
    assert payloads.max_retries(None, 0) == 0


def test_error_message_is_the_exception_text():
    assert payloads.error_message(RuntimeError("card declined")) == "card declined"
    assert payloads.error_message(KeyError("sku")) == "'sku'"


def test_error_message_survives_a_str_that_raises():
    assert payloads.error_message(BadStrError()) == "#<testproject.demo.jobs.BadStrError>"


def test_error_message_survives_a_str_that_returns_a_non_string():
    class NotAString(Exception):
        def __str__(self):
            return 42

    assert payloads.error_message(NotAString()) == f"#<{__name__}.{NotAString.__qualname__}>"


def test_error_message_is_truncated():
    message = payloads.error_message(ValueError("x" * (payloads.ERROR_MESSAGE_LIMIT * 3)))
    assert message == "x" * payloads.ERROR_MESSAGE_LIMIT


def test_error_class_names_module_and_class_builtins_bare():
    assert payloads.error_class(ValueError()) == "ValueError"
    assert payloads.error_class(BadStrError()) == "testproject.demo.jobs.BadStrError"


def test_backtrace_keeps_the_last_lines_and_survives_a_bad_str():
    def fail():
        raise BadStrError()

    try:
        fail()
    except BadStrError as exc:
        caught = exc
    lines = payloads.backtrace(caught, 50)
    assert any("in fail" in line for line in lines)
    assert len(payloads.backtrace(caught, 2)) == 2


def test_encode_is_one_line_and_round_trips():
    payload = {"jid": "abc", "class": "app.jobs.Send", "args": [1, "é", None, [2.5]], "kwargs": {"a": {"b": 1}}}
    raw = payloads.encode(payload)
    assert "\n" not in raw and "é" in raw
    assert payloads.decode(raw) == payload
    assert payloads.decode(raw.encode()) == payload


def test_encode_refuses_nan():
    with pytest.raises(ValueError):
        payloads.encode({"class": "x", "args": [float("nan")]})


@pytest.mark.parametrize(("raw", "reason"), [
    ("not json", "unparseable payload"),
    (b"\xff\xfe\x00", "unparseable payload"),
    ("[" * 100_000, "unparseable payload"),  # nested deeper than the parser goes
    ('["a list"]', "payload is a JSON list, not an object"),
    ('"a string"', "payload is a JSON str, not an object"),
    ("42", "payload is a JSON int, not an object"),
    ("null", "payload is a JSON NoneType, not an object"),
    ('{"args": []}', "payload has no job class"),
    ('{"class": 5}', "payload has no job class"),
    ('{"class": "x", "args": {}}', "payload args must be a list and kwargs an object"),
    ('{"class": "x", "kwargs": []}', "payload args must be a list and kwargs an object"),
])
def test_decode_rejects_what_is_not_a_job(raw, reason):
    with pytest.raises(PayloadError, match=reason):
        payloads.decode(raw)


def test_dead_letter_keeps_the_raw_bytes_and_says_why():
    entry = payloads.dead_letter(b'{"class": \xff', "unparseable payload: oops", now=1000.0)
    assert entry["class"] == payloads.UNPARSEABLE_CLASS == "(unparseable)"
    assert entry["raw"] == '{"class": \ufffd'
    assert (entry["error_message"], entry["dead_reason"], entry["failed_at"]) == (
        "unparseable payload: oops", "unparseable payload: oops", 1000.0)
    json.loads(payloads.encode(entry))  # storable as it is


def test_jids_are_24_hex_characters_and_unique():
    jids = {payloads.new_jid() for _ in range(1000)}
    assert len(jids) == 1000
    assert all(len(j) == 24 and int(j, 16) >= 0 for j in jids)


@pytest.mark.parametrize(("value", "where"), [
    ((1, 2), "args[0]"), ({1, 2}, "args[0]"), (b"raw", "args[0]"), (float("nan"), "args[0]"),
    (float("-inf"), "args[0]"), ([1, {"k": (2,)}], "args[0][1]['k']"), ({3: "x"}, "args[0]"),
])
def test_check_json_native_names_the_path(value, where):
    with pytest.raises(TypeError) as info:
        payloads.check_json_native([value], "args")
    assert str(info.value).startswith(where + " ")


def test_check_json_native_accepts_json_types():
    payloads.check_json_native([None, True, 1, 2**70, 1.5, "s", [], {}, {"a": [1, {"b": None}]}], "args")
