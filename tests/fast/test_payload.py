"""payload: encode/decode, the cautious reading of ``retry``, and error text that never raises."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from django_cogworker import PayloadError
from django_cogworker.push import payload as payloads
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
    assert payloads.error_message(BadStrError()) == "#<BadStrError>"


def test_error_message_survives_a_str_that_returns_a_non_string():
    class NotAString(Exception):
        def __str__(self):
            return 42

    assert payloads.error_message(NotAString()) == "#<NotAString>"


def test_error_message_is_truncated():
    message = payloads.error_message(ValueError("x" * (payloads.ERROR_MESSAGE_LIMIT * 3)))
    assert message == "x" * payloads.ERROR_MESSAGE_LIMIT


def test_error_class_names_module_and_class_builtins_bare():
    assert payloads.error_class(ValueError()) == "ValueError"
    assert payloads.error_class(BadStrError()) == "testproject.demo.jobs.BadStrError"


def test_backtrace_keeps_the_last_frames_and_survives_a_bad_str():
    def fail():
        raise BadStrError()

    try:
        fail()
    except BadStrError as exc:
        caught = exc
    lines = payloads.backtrace(caught, 50)
    assert any("in fail" in line for line in lines)
    assert sum(line.startswith("  File ") for line in payloads.backtrace(caught, 1)) == 1  # (frames)


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


# -- encoding, fast paths ------------------------------------------------------------------------

_SPEC = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@pytest.mark.parametrize("value", [
    {"jid": "a" * 24, "class": "a.B", "args": [1.5, "é\n\"", 2**70, -0.0, None, True], "kwargs": {"k": [{}]},
     "queue": "q", "retry": 3, "created_at": 1796289727.6903894},
    {"1": {"nested": [[[]]]}}, {2: "int key", True: "bool key"}, "a string", [], 0.1,
])
def test_encode_writes_what_the_json_encoder_writes(value):
    assert payloads.encode(value) == _SPEC.encode(value)


@pytest.mark.parametrize(("value", "error"), [
    ({"f": float("nan")}, ValueError), ({"args": [float("inf")]}, ValueError), ({"o": object()}, TypeError),
])
def test_encode_refuses_what_json_can_not_hold(value, error):
    with pytest.raises(error):
        payloads.encode(value)


def _bulk(n, **extra):
    """Payloads as perform_bulk makes them: copies of the first, with their own jid, args, kwargs."""
    first = {"jid": payloads.new_jid(), "class": "a.B", "args": [0], "kwargs": {}, "queue": "q", "retry": True,
             "created_at": 1796289727.6903894, **extra}
    items = [first]
    for i in range(1, n):
        item = first.copy()
        item.update(jid=payloads.new_jid(), args=[i, float(i) / 3, {"é": [None, "x\u2028"]}], kwargs={})
        items.append(item)
    for item in items:
        item["enqueued_at"] = 1796289727.7
    return items


def test_encode_many_writes_what_encode_writes_for_a_bulk():
    items = _bulk(50, unique_for=60, unique_until="start", unique_digest="d" * 64, dead=False)
    for i, item in enumerate(items):
        item["unique_digest"] = f"{i:064x}"
    assert payloads.encode_many(items) == [payloads.encode(p) for p in items]


def test_encode_many_encodes_in_full_an_item_that_differs_beyond_its_own_fields():
    # What a client middleware may have done to one job of a bulk: a field changed (to an equal
    # value of another type, too), added, removed, or the keys reordered.
    items = _bulk(8)
    items[1]["retry"] = 1  # == True, but encodes as 1
    items[2]["tenant"] = "acme"
    del items[3]["retry"]
    items[4] = dict(reversed(list(items[4].items())))
    items[5]["created_at"] = 1796289727.0
    items[6]["queue"] = "other"
    out = payloads.encode_many(items)
    assert out == [payloads.encode(p) for p in items]
    assert json.loads(out[1])["retry"] == 1 and json.loads(out[2])["tenant"] == "acme"


@pytest.mark.parametrize("items", [[], [{"jid": "x"}], [{1: "a"}, {1: "a"}]], ids=["none", "one", "int keys"])
def test_encode_many_small_or_odd_batches(items):
    assert payloads.encode_many(items) == [payloads.encode(p) for p in items]


def test_encode_many_raises_as_encode_does():
    items = _bulk(3)
    items[2]["args"] = [float("nan")]
    with pytest.raises(ValueError):
        payloads.encode_many(items)


def test_jids_come_from_a_pool_refilled_as_it_empties():
    jids = [payloads.new_jid() for _ in range(500)]
    assert len(set(jids)) == 500
    assert all(len(j) == 24 and int(j, 16) >= 0 for j in jids)
    assert len(set(payloads.new_jids(500)) | set(jids)) == 1000


def test_a_forked_child_does_not_hand_out_its_parents_next_jids():
    payloads.new_jid()  # the pool holds jids now
    read, write = os.pipe()
    with warnings.catch_warnings():  # (3.12+ warns of fork in a process with threads; the child only writes)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        os.write(write, ",".join(payloads.new_jid() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent = [payloads.new_jid() for _ in range(5)]
    assert len(child) == 5 and not set(child) & set(parent)


# -- text that can't be written as it is -----------------------------------------------------------

SURROGATE = os.fsdecode(b"caf\xe9.bad")  # what os.listdir gives for a file name that isn't UTF-8


def test_a_payload_holding_a_lone_surrogate_is_written_as_utf8_and_reads_back_the_same():
    payload = {"jid": "j", "class": "a.B", "args": [SURROGATE, "é"], "kwargs": {"\ud800": 1}, "queue": "q"}

    for text in (payloads.encode(payload), *payloads.encode_many([payload, dict(payload, jid="k")])):
        text.encode("utf-8")  # what Redis is sent: no UnicodeEncodeError
        assert payloads.decode(text.encode())["args"] == payload["args"]
    assert payloads.decode(payloads.encode(payload))["kwargs"] == {"\ud800": 1}
    assert payloads.encode({"args": ["é"]}) == '{"args":["é"]}'  # the rest is written as before


def test_error_texts_escape_lone_surrogates_and_stay_within_the_limit():
    odd = type("BadError", (Exception,), {"__module__": "caf\udce9"})  # (a module name is any str)
    try:
        raise odd(f"cannot process {SURROGATE} " + "\udce9" * payloads.ERROR_MESSAGE_LIMIT)
    except Exception as exc:
        caught = exc

    message = payloads.error_message(caught)
    assert message.startswith("cannot process caf\\udce9.bad \\udce9")
    assert len(message) == payloads.ERROR_MESSAGE_LIMIT
    assert payloads.error_class(caught) == "caf\\udce9.BadError"
    lines = payloads.backtrace(caught, 50)
    for text in (message, payloads.error_class(caught), *lines):
        text.encode("utf-8")
    assert all(len(line) <= payloads.ERROR_MESSAGE_LIMIT for line in lines)


def test_printable_escapes_what_would_break_a_log_line_and_cuts_it():
    assert payloads.printable("abc123") == "abc123"
    assert payloads.printable("x\n2026-01-01 ERROR forged") == "x\\n2026-01-01 ERROR forged"
    assert payloads.printable("a\r\tb\x1b[31m\u202e" + SURROGATE) == "a\\r\\tb\\x1b[31m\\u202ecaf\\udce9.bad"
    assert payloads.printable("é and ü") == "é and ü"
    assert payloads.printable("y" * 500) == "y" * payloads.LOG_FIELD_LIMIT
    assert payloads.printable(None) == "None"


def test_a_dead_letter_for_10_mb_that_are_not_utf8_is_not_bigger_than_what_it_holds():
    raw = b"\xff" * 10_000_000

    stored = payloads.encode(payloads.dead_letter(raw, "unparseable payload", now=1000.0)).encode()

    # Each byte read as U+FFFD (three bytes in UTF-8) made it a 31 MB entry.
    assert len(stored) <= len(raw) + 1000
    entry = json.loads(stored)
    assert entry["raw"].startswith("\ufffd" * 1000) and entry["raw_size"] == len(raw)
    # What is small is kept whole.
    small = b'{"class": "x", \x01\x02 "args": [' + b"\xfe" * 100
    entry = payloads.dead_letter(small, "unparseable payload", now=1000.0)
    assert entry["raw"] == small.decode("utf-8", "replace") and "raw_size" not in entry


def test_append_fields_keeps_the_payload_byte_for_byte_and_adds_the_fields():
    raw = b'{"jid":"j","class":"a.B","args":[1e309,"\\ud800"],"kwargs":{},"queue":"q","dead_reason":"old"} \n'

    kept = payloads.append_fields(raw, {"dead_reason": f"no {SURROGATE}", "failed_at": 5.0})

    assert kept.startswith(raw.rstrip()[:-1])
    read = payloads.decode(kept)
    assert (read["dead_reason"], read["failed_at"], read["args"]) == (f"no {SURROGATE}", 5.0, [float("inf"), "\ud800"])
    assert payloads.append_fields(b'{"class":"x"}', {"a": 1}) == b'{"class":"x","a":1}'
    with pytest.raises(PayloadError):
        payloads.append_fields(b'["not", "an object"]', {"a": 1})
