"""job: Job classes, their options, per-push options, the perform_* family and the registry."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import time
import zoneinfo

import pytest
from peek import queued_payloads

from django_cogworker import CogworkerError, Job, JobSetter
from django_cogworker.push.job import registered, registry
from testproject.demo.jobs import SendReceipt


class Plain(Job):
    def perform(self, *args, **kwargs):
        pass


class Mailer(Job):
    queue = "mail"
    retry = 5
    backtrace = 10


class Disposable(Job):
    retry = False
    dead = False


class Named(Job):
    name = "billing.charge"


def scheduled(r):
    return [(json.loads(raw), score) for raw, score in r.zrange("cogworker:schedule", 0, -1, withscores=True)]


# -- registry ----------------------------------------------------------------------------------


def test_jobs_register_under_module_and_qualified_name():
    assert SendReceipt.name == "testproject.demo.jobs.SendReceipt"
    assert registered("testproject.demo.jobs.SendReceipt") is SendReceipt
    assert registered(Plain.name) is Plain and Plain.name == f"{__name__}.Plain"
    assert registry()[Mailer.name] is Mailer


def test_explicit_name_is_used_and_survives_a_move():
    assert registered("billing.charge") is Named


def test_registry_resolves_names_never_imports():
    # A payload naming any importable callable must not be run: only registered jobs exist.
    assert registered("os.system") is None
    assert registered("django_cogworker.push.job.Job") is None


def test_a_second_class_taking_a_name_is_refused():
    with pytest.raises(CogworkerError, match=re.escape(f"job name 'billing.charge' is taken by {__name__}.Named")):
        class Impostor(Job):
            name = "billing.charge"
    assert registered("billing.charge") is Named


def test_redefining_the_same_class_replaces_it():
    # Reloading a module (a shell, an autoreloader) defines the same module.qualname again.
    def define():
        class Reloaded(Job):
            pass
        return Reloaded

    first, second = define(), define()
    assert first is not second and first.name == second.name
    assert registered(second.name) is second


def test_subclass_gets_its_own_name():
    class Child(Mailer):
        pass

    assert Child.name.endswith("test_subclass_gets_its_own_name.<locals>.Child")
    assert registered(Child.name) is Child and registered(Mailer.name) is Mailer
    assert (Child.queue, Child.retry) == ("mail", 5)


# -- options -----------------------------------------------------------------------------------


def test_class_options_land_in_the_payload(r):
    jid = Mailer.perform_async(7)
    (payload,) = queued_payloads(r, "mail")
    assert payload["jid"] == jid
    assert (payload["class"], payload["queue"], payload["retry"], payload["backtrace"]) == (
        Mailer.name, "mail", 5, 10)
    assert "dead" not in payload


def test_defaults_are_default_queue_and_retry_true(r):
    Plain.perform_async()
    (payload,) = queued_payloads(r)
    assert (payload["queue"], payload["retry"]) == ("default", True)
    assert "dead" not in payload and "backtrace" not in payload


def test_class_options_are_read_at_each_push(r, monkeypatch):
    # perform_async keeps one option-less pusher per class: it must not keep the options too.
    Plain.perform_async(1)
    monkeypatch.setattr(Plain, "queue", "later")
    monkeypatch.setattr(Plain, "retry", 2)
    Plain.perform_async(2)
    waiting = queued_payloads(r) + queued_payloads(r, "later")
    assert [(p["queue"], p["retry"]) for p in waiting] == [("default", True), ("later", 2)]


def test_dead_false_and_retry_false_are_carried(r):
    Disposable.perform_async()
    (payload,) = queued_payloads(r)
    assert (payload["retry"], payload["dead"]) == (False, False)


def test_set_overrides_options_for_one_push_only(r):
    setter = Mailer.set(queue="urgent", retry=1, dead=False, backtrace=True)
    assert isinstance(setter, JobSetter)
    setter.perform_async(1)
    Mailer.perform_async(2)
    (urgent,) = queued_payloads(r, "urgent")
    assert (urgent["queue"], urgent["retry"], urgent["dead"], urgent["backtrace"], urgent["args"]) == (
        "urgent", 1, False, True, [1])
    (mail,) = queued_payloads(r, "mail")
    assert (mail["queue"], mail["retry"], mail["args"]) == ("mail", 5, [2])
    assert r.smembers("cogworker:queues") == {"urgent", "mail"}


def test_set_rejects_unknown_options_and_bad_queue():
    with pytest.raises(TypeError, match=r"unknown push option\(s\) \['retries'\]"):
        Plain.set(retries=3)
    with pytest.raises(TypeError, match="queue must be a non-empty string, got ''"):
        Plain.set(queue="")


@pytest.mark.parametrize("queue", ["", None, 5])
def test_a_job_class_with_a_bad_queue_fails_where_it_is_defined(queue):
    with pytest.raises(CogworkerError, match=f"BadQueue.queue must be a non-empty string, got {queue!r}"):
        type("BadQueue", (Job,), {"queue": queue, "perform": lambda self: None})


# -- perform_async / perform_in / perform_at ----------------------------------------------------


def test_perform_async_returns_the_jid_and_keeps_args_and_kwargs(r):
    jid = Plain.perform_async(1, "two", [3], {"four": 4}, flag=True, when=None)
    (payload,) = queued_payloads(r)
    assert payload["jid"] == jid and len(jid) == 24
    assert payload["args"] == [1, "two", [3], {"four": 4}]
    assert payload["kwargs"] == {"flag": True, "when": None}


def test_perform_in_seconds_or_timedelta_schedules(r):
    before = time.time()
    jid1 = Plain.perform_in(60, "a")
    jid2 = Plain.perform_in(dt.timedelta(hours=1), "b")
    after = time.time()
    entries = {p["jid"]: (p, score) for p, score in scheduled(r)}
    assert before + 60 <= entries[jid1][1] <= after + 60
    assert before + 3600 <= entries[jid2][1] <= after + 3600
    assert entries[jid1][0]["args"] == ["a"] and "enqueued_at" not in entries[jid1][0]
    assert "at" not in entries[jid1][0]
    assert r.exists("cogworker:queue:default") == 0


def test_perform_at_aware_datetime_or_epoch(r):
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    when = dt.datetime(2099, 1, 2, 3, 4, 5, tzinfo=paris)
    jid1 = Plain.perform_at(when, 1)
    jid2 = Plain.perform_at(4_102_444_800.5, 2)
    scores = {p["jid"]: score for p, score in scheduled(r)}
    assert scores == {jid1: when.timestamp(), jid2: 4_102_444_800.5}


def test_perform_at_a_naive_datetime_is_refused(r):
    with pytest.raises(ValueError, match="aware datetime"):
        Plain.perform_at(dt.datetime(2099, 1, 1), 1)
    assert r.dbsize() == 0


@pytest.mark.parametrize("when", ["2099-01-01", None, True, dt.date(2099, 1, 1)])
def test_perform_at_refuses_what_is_not_a_time(r, when):
    with pytest.raises(TypeError):
        Plain.perform_at(when)
    assert r.dbsize() == 0


@pytest.mark.parametrize("delay", ["60", None, True])
def test_perform_in_refuses_what_is_not_a_delay(r, delay):
    with pytest.raises(TypeError, match="perform_in takes seconds or a timedelta"):
        Plain.perform_in(delay)
    assert r.dbsize() == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_time_that_is_not_finite_is_refused(r, bad):
    with pytest.raises(ValueError, match="must be finite"):
        Plain.perform_in(bad)
    with pytest.raises(ValueError, match="must be finite"):
        Plain.perform_at(bad)
    assert r.dbsize() == 0


def test_a_time_in_the_past_is_enqueued_at_once(r):
    jid1 = Plain.perform_at(time.time() - 10)
    jid2 = Plain.perform_in(-5)
    jid3 = Plain.perform_in(0)
    assert [p["jid"] for p in queued_payloads(r)] == [jid1, jid2, jid3]
    assert r.zcard("cogworker:schedule") == 0


def test_set_works_with_every_perform(r):
    Plain.set(queue="later").perform_in(30)
    Plain.set(queue="later").perform_at(time.time() + 30)
    Plain.set(queue="bulk").perform_bulk([(1,)])
    assert [p["queue"] for p, _ in scheduled(r)] == ["later", "later"]
    assert [p["queue"] for p in queued_payloads(r, "bulk")] == ["bulk"]


# -- JSON-native arguments only ----------------------------------------------------------------


@pytest.mark.parametrize(("args", "kwargs", "where", "kind"), [
    ((1, (2, 3)), {}, "args[1]", "tuple"),
    (({"a", "b"},), {}, "args[0]", "set"),
    ((), {"when": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)}, "kwargs['when']", "datetime"),
    ((decimal.Decimal("9.99"),), {}, "args[0]", "Decimal"),
    ((1, float("nan")), {}, "args[1]", None),
    (({"nested": [1, b"x"]},), {}, "args[0]['nested'][1]", "bytes"),
    (({1: "one"},), {}, "args[0]", None),
    ((object(),), {}, "args[0]", "object"),
])
def test_non_json_arguments_raise_at_push_naming_the_argument(r, args, kwargs, where, kind):
    with pytest.raises(TypeError) as info:
        Plain.perform_async(*args, **kwargs)
    message = str(info.value)
    assert message.startswith(where + " ")
    if kind:
        assert f"is {'an' if kind == 'object' else 'a'} {kind} " in message
    assert r.dbsize() == 0


def test_a_model_instance_is_refused_with_a_hint_to_send_its_pk(r):
    from testproject.demo.models import Receipt

    receipt = Receipt(pk=7, order_id=1)
    with pytest.raises(TypeError) as info:
        SendReceipt.perform_async(receipt)
    message = str(info.value)
    assert message.startswith("args[0] is a Receipt (")
    assert message.endswith("job arguments must be JSON-native (str, int, float, bool, None, list, dict with str "
                            "keys) (send its primary key, 7, and fetch it again in perform)")
    with pytest.raises(TypeError, match=r"^kwargs\['order'\] is an Order \(.*\(send its primary key, 'A-1'"):
        Plain.perform_async(order=type("Order", (), {"_meta": None, "pk": "A-1"})())
    assert r.dbsize() == 0


def test_non_json_argument_refused_for_scheduled_pushes_too(r):
    with pytest.raises(TypeError, match=r"^args\[0\] is a tuple"):
        Plain.perform_in(10, (1,))
    assert r.dbsize() == 0


def test_tuple_hint_suggests_a_list():
    with pytest.raises(TypeError, match=r"\(use a list\)"):
        Plain.perform_async((1, 2))


class Hello(Job):
    def perform(self, name, greeting="hello", *, loud=False):
        pass


@pytest.mark.parametrize(("args", "kwargs", "why"), [
    ((1, 2, 3), {}, "(1, 2, 3): too many positional arguments"),
    ((), {}, "(): missing a required argument: 'name'"),
    (("ann",), {"shout": True}, "('ann', shout=True): got an unexpected keyword argument 'shout'"),
])
def test_arguments_perform_can_not_take_are_refused_at_the_push(r, args, kwargs, why):
    # Hello.perform_async(1, 2, 3) returned a jid, then failed in the worker and retried for 20 days.
    signature = "(name, greeting='hello', *, loud=False)"
    for push in (Hello.perform_async, lambda *a, **k: Hello.perform_in(60, *a, **k),
                 Hello.set(queue="mail").perform_async):
        with pytest.raises(TypeError) as info:
            push(*args, **kwargs)
        assert str(info.value) == f"{Hello.name}.perform{signature} can't take {why}"
    assert r.dbsize() == 0


def test_arguments_perform_takes_are_pushed(r):
    for args, kwargs in ((("ann",), {}), (("ann", "hi"), {}), (("ann",), {"loud": True}), ((), {"name": "ann"})):
        assert Hello.perform_async(*args, **kwargs)
    assert [(p["args"], p["kwargs"]) for p in queued_payloads(r)] == [
        (["ann"], {}), (["ann", "hi"], {}), (["ann"], {"loud": True}), ([], {"name": "ann"})]


def test_a_call_shape_that_bound_once_does_not_let_another_through(r):
    assert Hello.perform_async("ann", loud=True) and Hello.perform_async("bob", loud=False)  # (one shape, kept)
    for args, kwargs in ((("ann", "hi", "x"), {"loud": True}), ((), {"loud": True}), (("ann",), {"name": "bob"})):
        with pytest.raises(TypeError, match="can't take"):
            Hello.perform_async(*args, **kwargs)
    assert len(queued_payloads(r)) == 2


def test_perform_bulk_names_the_item_perform_can_not_take(r):
    with pytest.raises(TypeError) as info:
        Hello.perform_bulk([["ann"], ["bob", "hi"], ["cy", "hi", "extra"]])
    assert str(info.value).startswith(f"perform_bulk item 2: {Hello.name}.perform(name, greeting='hello', *, "
                                      f"loud=False) can't take ('cy', 'hi', 'extra'): too many positional")
    assert r.dbsize() == 0


def test_a_perform_replaced_on_the_class_is_checked_afresh(r, monkeypatch):
    assert Hello.perform_async("ann")
    monkeypatch.setattr(Hello, "perform", lambda self, a, b: None)
    with pytest.raises(TypeError, match=r"perform\(a, b\) can't take \('ann'\): missing"):
        Hello.perform_async("ann")
    assert Hello.perform_async("ann", "bob")


def test_perform_without_perform_defined_says_so():
    with pytest.raises(NotImplementedError, match="Named.perform is not defined"):
        Named().perform()


def test_job_instance_knows_its_jid_and_payload():
    job = Plain({"jid": "abc", "class": Plain.name, "args": []})
    assert (job.jid, job.payload["class"]) == ("abc", Plain.name)


@pytest.mark.parametrize("option,value", [("timeout", 0), ("timeout", True), ("result_ttl", -5),
                                          ("result_ttl", float("nan")), ("timeout", "60")])
def test_a_bad_timeout_or_result_ttl_is_refused_at_class_definition(option, value):
    with pytest.raises(CogworkerError, match=rf"\.{option} must be a positive number of seconds or None, got"):
        type("BadSecondsJob", (Job,), {option: value, "__module__": __name__})


# -- expires_in ---------------------------------------------------------------------------------


class Perishable(Job):
    expires_in = 30

    def perform(self, *args):
        pass


def test_expires_in_on_the_class_or_per_push_sets_expires_at_from_the_push(r):
    Perishable.perform_async(1)
    Perishable.set(expires_in=0.5).perform_async(2)
    Plain.perform_async(3)
    Plain.set(expires_in=2).perform_bulk([(4,)])
    by_args = {tuple(p["args"]): p for p in queued_payloads(r)}
    assert by_args[(1,)]["expires_at"] == by_args[(1,)]["created_at"] + 30
    assert by_args[(2,)]["expires_at"] == by_args[(2,)]["created_at"] + 0.5
    assert "expires_at" not in by_args[(3,)]  # (none asked: never expires)
    assert by_args[(4,)]["expires_at"] == by_args[(4,)]["created_at"] + 2
    assert "expires_in" not in by_args[(2,)]


def test_perform_in_and_perform_at_count_expires_in_from_the_due_time(r):
    in_a_minute = Perishable.perform_in(60, "in")
    at_an_hour = Perishable.set(expires_in=5).perform_at(time.time() + 3600, "at")
    entries = {p["jid"]: (p, score) for p, score in scheduled(r)}
    payload, due = entries[in_a_minute]
    assert payload["expires_at"] == pytest.approx(due + 30, abs=0.01)
    payload, due = entries[at_an_hour]
    assert payload["expires_at"] == pytest.approx(due + 5, abs=0.01)
    # A time in the past is due at once: counted from the push, never before it.
    Perishable.perform_at(time.time() - 100, "past")
    (past,) = queued_payloads(r)
    assert past["expires_at"] == past["created_at"] + 30


@pytest.mark.parametrize("value", [0, -1, True, "30", float("inf")])
def test_a_bad_expires_in_is_refused_on_the_class_and_at_the_push(r, value):
    with pytest.raises(CogworkerError, match=r"\.expires_in must be a positive number of seconds or None, got"):
        type("BadExpiryJob", (Job,), {"expires_in": value, "__module__": __name__})
    with pytest.raises(CogworkerError, match=r"expires_in must be a positive number of seconds or None, got"):
        Plain.set(expires_in=value).perform_async()
    assert r.dbsize() == 0


# -- limits and expires_in (flow control) ---------------------------------------------------------


@pytest.mark.parametrize(("limits", "message"), [
    (["partner"], r"test_job\.BadLimits\.limits\[0\] must be a Limiter \(Limiter\.concurrent, bucket, window or "
                  r"leaky\), got 'partner'"),
    ([None], r"test_job\.BadLimits\.limits\[0\] must be a Limiter"),
    ("partner", r"test_job\.BadLimits\.limits must be a list of limiters \(Limiter\.concurrent\(\.\.\.\), \.\.\.\), "
                r"got 'partner'"),
    (None, r"test_job\.BadLimits\.limits must be a list of limiters"),
])
def test_limits_that_are_not_limiters_are_refused_at_class_definition_naming_the_job(limits, message):
    with pytest.raises(CogworkerError, match=message):
        type("BadLimits", (Job,), {"limits": limits, "perform": lambda self: None, "__module__": __name__})


def test_a_single_limiter_not_in_a_list_and_a_later_bad_entry_are_refused():
    from django_cogworker import Limiter
    from testproject.demo.flow_jobs import partner

    with pytest.raises(CogworkerError, match=r"BadLimits\.limits must be a list of limiters .*, got "
                                             r"Limiter\.concurrent\('demo:partner', 3"):
        type("BadLimits", (Job,), {"limits": partner, "__module__": __name__})
    with pytest.raises(CogworkerError, match=r"BadLimits\.limits\[1\] must be a Limiter.* got <class"):
        type("BadLimits", (Job,), {"limits": [partner, Limiter], "__module__": __name__})


def test_limits_are_kept_as_a_tuple():
    from testproject.demo.flow_jobs import partner

    limited = type("LimitedJob", (Job,), {"limits": [partner], "__module__": __name__})
    assert limited.limits == (partner,)
    assert Plain.limits == ()


@pytest.mark.parametrize("value", [0, -1, True, "30", float("nan"), float("inf")])
def test_a_bad_expires_in_is_refused_at_class_definition(value):
    with pytest.raises(CogworkerError, match=rf"BadExpiry\.expires_in must be a positive number of seconds or None, "
                                             rf"got {re.escape(repr(value))}"):
        type("BadExpiry", (Job,), {"expires_in": value, "__module__": __name__})


@pytest.mark.parametrize("value", [0, -5, False, "30", float("nan")])
def test_a_bad_expires_in_given_to_set_is_refused_at_the_push_and_nothing_is_pushed(r, value):
    with pytest.raises(CogworkerError, match=rf"{Plain.name}: expires_in must be a positive number of seconds"):
        Plain.set(expires_in=value).perform_async(1)
    assert r.dbsize() == 0


def test_expires_in_sets_expires_at_from_the_push_or_the_due_time(r):
    expiring = type("Expiring", (Job,), {"expires_in": 30, "perform": lambda self, n: None, "__module__": __name__})
    expiring.perform_async(1)
    Plain.set(expires_in=2.5).perform_async(2)
    first, second = queued_payloads(r)
    assert first["expires_at"] == first["created_at"] + 30
    assert second["expires_at"] == second["created_at"] + 2.5
    assert "expires_at" not in Plain.set(queue="other").build([3], {})  # (none unless asked)
    at = time.time() + 100
    expiring.perform_at(at, 3)
    ((due, score),) = scheduled(r)
    assert score == pytest.approx(at, abs=1e-3)
    assert due["expires_at"] == pytest.approx(at + 30, abs=1e-3)  # 30 s after it is due, not pushed


# -- values past what Redis or Python holds ---------------------------------------------------------


@pytest.mark.parametrize("value", [10**400, 1e16, 1e9 + 1])
def test_seconds_past_the_bound_are_refused_on_the_class_at_set_and_at_the_push(r, value):
    # (10**400 raised OverflowError; 1e16 was pushed, a TTL Redis refuses.)
    shown = re.escape(repr(value)[:40])
    for option in ("expires_in", "result_ttl", "timeout", "unique_for"):
        with pytest.raises(CogworkerError, match=rf"{option} must be at most 1e9 seconds \(about 31 years\), "
                                                 rf"got {shown}"):
            type("FarJob", (Job,), {option: value, "__module__": __name__})
    with pytest.raises(CogworkerError, match=rf"{Plain.name}: expires_in must be at most 1e9 seconds"):
        Plain.set(expires_in=value)  # (at set: a workflow's step pushes it in a worker)
    with pytest.raises(CogworkerError, match=rf"{Plain.name}: unique_for must be at most 1e9 seconds"):
        Plain.set(unique_for=value).perform_async(1)
    assert r.dbsize() == 0
    Plain.set(expires_in=1e9).perform_async(1)  # (the bound itself is taken)
    (payload,) = queued_payloads(r)
    assert payload["expires_at"] == payload["created_at"] + 1e9


def test_a_delay_or_time_past_what_a_float_holds_is_refused(r):
    with pytest.raises(ValueError, match="must be finite") as info:
        Plain.perform_in(10**400)  # (OverflowError before)
    assert isinstance(info.value, CogworkerError)
    with pytest.raises(CogworkerError, match="the time to run a job must be finite"):
        Plain.perform_at(10**400)
    assert r.dbsize() == 0


def nested_list(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_arguments_nested_past_max_depth_are_refused_naming_the_limit(r):
    from django_cogworker.bounds import MAX_DEPTH

    looped: list = []
    looped.append(looped)
    cases = [((nested_list(MAX_DEPTH + 1),), {}), ((), {"deep": nested_list(2000)}), ((looped,), {})]
    for args, kwargs in cases:  # (2,000 levels, or a list holding itself, raised RecursionError)
        with pytest.raises(CogworkerError, match=rf"^(args\[0\]|kwargs\['deep'\])\[0\]\[0\].* nests lists and dicts "
                                                 rf"more than {MAX_DEPTH} deep"):
            Plain.perform_async(*args, **kwargs)
    with pytest.raises(CogworkerError, match=r"^perform_bulk item 1: args\[0\].* more than"):
        Plain.perform_bulk([[1], [nested_list(MAX_DEPTH + 1)]])
    assert r.dbsize() == 0
    Plain.perform_async(nested_list(MAX_DEPTH), deep={"a": nested_list(MAX_DEPTH - 1)})  # (the deepest taken)
    assert queued_payloads(r)[0]["args"] == [nested_list(MAX_DEPTH)]


def test_a_queue_that_utf8_can_not_carry_is_refused_at_set(r):
    with pytest.raises(CogworkerError, match=r"queue must be text UTF-8 can encode \(no lone surrogate\), "
                                             r"got 'mail\\udc80'"):
        Plain.set(queue="mail\udc80")
    assert r.dbsize() == 0
