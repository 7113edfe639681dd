"""Groups and priorities around the core's fetch (features/fairness/): the options refused at the class
and the push with messages that name them, the payload's first field as the fetch reads it, the
per-group pause and resume scripts on the suite's Redis, the sizes that count a queue's lanes, the
per-group limiter keys, and lane keys of the wrong type in the api, the CLI, the metrics and the
key guard. The fetch taking turns is the core's (tests/workers: the lead's)."""

from __future__ import annotations

import json
import random
import re

import pytest
from engine_fixtures import make_config
from limiter_fixtures import (
    fresh_limiters,  # noqa: F401 - the fresh_limiters fixture
    unique,
)

from django_cogworker import Job, Limiter, api
from django_cogworker.broker.keys import Keys
from django_cogworker.engine.fetch.contract import Unit
from django_cogworker.engine.recovery.key_guard import KeyGuard
from django_cogworker.engine.run.hooks import JobRun, Outcome
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.errors import InvalidArgument
from django_cogworker.features.fairness.limits import GROUP_LIMITS
from django_cogworker.features.limits.gate import LimitGate, Ticket
from django_cogworker.features.limits.hook import ClassLimits
from django_cogworker.metrics.collect import collect
from django_cogworker.push.job import JobSetter

K = Keys()
Q = "fair-fast"
per_tenant = Limiter.concurrent("test:fair:tenant", 1)


class ByArg(Job):
    queue = Q
    group = "arg:0"

    def perform(self, tenant, n=0): ...


class ByKwarg(Job):
    queue = Q
    group = "kwarg:tenant"

    def perform(self, n=0, tenant=None): ...


class ByFunction(Job):
    queue = Q
    group = staticmethod(lambda order, *_: order["shop"])  # (a function of the job's arguments)

    def perform(self, order): ...


class Plain(Job):
    queue = Q

    def perform(self, *args): ...


class Urgent(Job):
    queue = Q
    priority = 10

    def perform(self, *args): ...


class TenantLimited(Job):
    queue = Q
    group = "arg:0"
    group_limits = [per_tenant]

    def perform(self, tenant): ...


def waiting(rb, queue: str = Q) -> list[bytes]:
    """The raw payloads waiting in ``queue``: its list, then its priorities (where the core's push
    writes a prioritized job), then its groups' lists."""
    lanes = K.lanes(queue)
    groups = [g for g in rb.lrange(lanes.ring, 0, -1) if g]
    found = [*rb.lrange(K.queue(queue), 0, -1), *rb.zrange(lanes.prio, 0, -1),
             *(raw for g in groups for raw in rb.lrange(lanes.group(g.decode()), 0, -1))]
    return [raw for raw in found if not raw.startswith(b'{"lane":')]  # (a doorbell the push rings: no job)


# -- options and the push's first field ---------------------------------------------------------------


@pytest.mark.parametrize("push, group", [
    (lambda: Plain.set(group="acme").perform_async(1), "acme"),
    (lambda: Plain.set(group=42).perform_async(1), "42"),  # (an int made a str)
    (lambda: ByArg.perform_async("t-1", 5), "t-1"),
    (lambda: ByKwarg.perform_async(n=1, tenant="shop.example@x"), "shop.example@x"),
    (lambda: ByFunction.perform_async({"shop": "s/9"}), "s/9"),
    (lambda: ByArg.set(group="other").perform_async("t-1"), "other"),  # (set() over the class's)
    (lambda: ByArg.perform_in(60, "later"), "later"),
])
def test_a_grouped_push_writes_group_as_the_payload_s_first_field(rb, push, group):
    push()
    raws = waiting(rb) or [raw for raw, _ in rb.zrange(K.schedule, 0, -1, withscores=True)]
    [raw] = raws
    assert raw.startswith(b'{"group":"' + group.encode() + b'",')  # (the fetch script reads this prefix)
    assert json.loads(raw)["group"] == group


def test_an_ungrouped_push_has_no_group_field(rb):
    ByArg.perform_async(None)  # (the id read is None: ungrouped)
    ByArg.set(group=None).perform_async("t")
    Plain.perform_async(1)
    assert all(b'"group"' not in raw for raw in waiting(rb)) and len(waiting(rb)) == 3


def test_a_bulk_push_gives_each_job_the_group_of_its_own_arguments(rb):
    ByArg.perform_bulk([["a"], ["b"], [None], ["a"]])
    groups = sorted(json.loads(raw).get("group", "-") for raw in waiting(rb))
    assert groups == ["-", "a", "a", "b"]
    assert all(list(json.loads(raw))[0] == "group" for raw in waiting(rb) if b'"group"' in raw)


def test_a_priority_is_the_payload_s_first_field_and_0_is_a_plain_job(rb):
    Urgent.perform_async(1)
    Plain.set(priority=-100).perform_async(2)
    Urgent.set(priority=0).perform_async(3)
    found = {json.loads(raw)["args"][0]: raw for raw in waiting(rb)}
    assert found[1].startswith(b'{"priority":10,') and found[2].startswith(b'{"priority":-100,')
    assert b'"priority"' not in found[3]


@pytest.mark.parametrize("value, message", [
    ("has space", "must be 1 to 100 characters of A-Za-z0-9_.:@/+=-"),
    ('q"uote', "must be 1 to 100 characters"),
    ("back\\slash", "must be 1 to 100 characters"),
    ("", "must be 1 to 100 characters"),
    ("x" * 101, "must be 1 to 100 characters"),
    (True, "must be a group id (a str or an int), got True"),
    (1.5, "must be a group id (a str or an int), got 1.5"),
    (["a"], "must be a group id"),
])
def test_a_bad_group_id_is_refused_at_set_naming_the_option(value, message):
    with pytest.raises(InvalidArgument, match="group " + re.escape(message)):
        Plain.set(group=value)


def test_a_bad_group_read_from_the_arguments_is_refused_at_the_push(rb):
    with pytest.raises(InvalidArgument, match=r"ByArg: group 'arg:0' must be 1 to 100 characters"):
        ByArg.perform_async("two words")
    with pytest.raises(InvalidArgument, match=r"group 'arg:0' reads argument 0, but the push has 0"):
        ByArg.perform_async()
    with pytest.raises(InvalidArgument, match=r"group 'kwarg:tenant' reads keyword argument 'tenant'"):
        ByKwarg.perform_async(1)
    with pytest.raises(InvalidArgument, match=r"its group function raised KeyError"):
        ByFunction.perform_async({})
    assert waiting(rb) == []


@pytest.mark.parametrize("value", [101, -101, True, 1.0, "5"])
def test_a_bad_priority_is_refused_at_set_and_at_the_class(value):
    with pytest.raises(InvalidArgument, match=r"priority must be a whole number from -100 to 100 \(0: none\)"):
        Plain.set(priority=value)
    with pytest.raises(InvalidArgument, match=r"\.priority must be a whole number from -100 to 100"):
        type("BadPriority", (Job,), {"priority": value, "__module__": __name__})


def _define(**attrs):
    return type("Defined", (Job,), {"__module__": __name__, "perform": lambda self, *a, **k: None, **attrs})


@pytest.mark.parametrize("attrs, message", [
    ({"group": "arg:x"}, r"\.group 'arg:N' takes an argument's position"),
    ({"group": "kwarg:1x"}, r"\.group 'kwarg:name' takes a keyword argument's name"),
    ({"group": "no spaces"}, r"\.group must be 1 to 100 characters"),
    ({"group": "arg:0", "priority": 5}, "group and priority can't be combined yet"),
    ({"group_limits": [per_tenant]}, "group_limits is given but group isn't"),
    ({"group": "arg:0", "group_limits": per_tenant}, r"\.group_limits must be a list of limiters"),
    ({"group": "arg:0", "group_limits": [Limiter.concurrent(lambda *a: "k", 1, family="test:fair:fn")]},
     "is keyed by a function"),
    ({"group": "arg:0", "encrypt": True}, "a job that encrypts its arguments can't read its group from them"),
])
def test_options_that_cant_be_are_refused_as_the_class_is_defined(attrs, message):
    with pytest.raises(InvalidArgument, match=message):
        _define(**attrs)


def test_a_sealed_job_may_take_a_literal_group_given_at_the_push_but_not_one_read_from_its_arguments():
    _define(group="fixed", encrypt=True)  # (an id the caller chose to show: allowed)
    with pytest.raises(InvalidArgument, match="can't read its group from them"):
        ByArg.set(encrypt=True)
    with pytest.raises(InvalidArgument, match="group and priority can't be combined yet"):
        ByArg.set(priority=3)
    with pytest.raises(InvalidArgument, match="group and priority can't be combined yet"):
        Plain.set(group="a", priority=3)
    ByArg.set(group=None, priority=3)  # (ungrouped for this push: a priority is fine)


# -- pause and resume ---------------------------------------------------------------------------------


def seed_groups(rb, queue: str = Q, groups: dict[str, int] | None = None) -> None:
    """Jobs waiting in groups as the core's fetch leaves them: each group's list, and the ring with ""."""
    lanes = K.lanes(queue)
    rb.sadd(K.queues, queue)
    for group, count in (groups or {}).items():
        for i in range(count):
            rb.lpush(lanes.group(group), json.dumps({"group": group, "jid": f"{group}-{i}", "class": "x",
                                                    "args": [], "queue": queue}))
        rb.lpush(lanes.ring, group)
    if groups:
        rb.rpush(lanes.ring, "")


def test_pausing_a_group_takes_it_off_the_ring_and_the_last_one_takes_the_ring(rb):
    seed_groups(rb, groups={"a": 3, "b": 1})
    lanes, queue = K.lanes(Q), api.Queue(Q)
    assert queue.pause_group("a") is True and queue.pause_group("a") is False
    assert rb.lrange(lanes.ring, 0, -1) == [b"b", b""] and rb.smembers(lanes.paused) == {b"a"}
    queue.pause_group("b")
    assert not rb.exists(lanes.ring)  # ("" alone: no group takes turns, the fetch reads the list alone)
    assert rb.llen(lanes.group("a")) == 3 and rb.llen(lanes.group("b")) == 1  # (their jobs stay)
    assert queue.size() == 4


def test_resuming_a_group_puts_it_back_in_a_ring_made_again_and_rings_the_doorbell_of_an_empty_queue(rb):
    seed_groups(rb, groups={"a": 2})
    lanes, queue = K.lanes(Q), api.Queue(Q)
    queue.pause_group("a")
    assert queue.resume_group("a") is True and queue.resume_group("a") is False
    assert rb.lrange(lanes.ring, 0, -1) == [b"a", b""]
    assert rb.lrange(K.queue(Q), 0, -1) == [b'{"lane":"bell","queue":"fair-fast"}']  # (once: then not empty)


def test_resuming_beside_a_queue_with_jobs_rings_no_bell_and_a_group_already_in_the_ring_isnt_added_twice(rb):
    seed_groups(rb, groups={"a": 1, "b": 1})
    Plain.perform_async(1)
    queue, lanes = api.Queue(Q), K.lanes(Q)
    queue.resume_group("b")  # (not paused: in the ring already)
    assert sorted(rb.lrange(lanes.ring, 0, -1)) == [b"", b"a", b"b"]
    assert rb.llen(K.queue(Q)) == 1


def test_resuming_a_group_with_no_jobs_only_unpauses_it(rb):
    queue, lanes = api.Queue(Q), K.lanes(Q)
    queue.pause_group("ahead")  # (paused before its first job: allowed)
    assert queue.resume_group("ahead") is True
    assert not rb.exists(lanes.ring) and not rb.exists(lanes.paused) and not rb.exists(K.queue(Q))


def test_a_bad_group_id_is_refused_by_pause_and_resume():
    with pytest.raises(InvalidArgument, match="group must be 1 to 100 characters"):
        api.Queue(Q).pause_group("a b")


# -- sizes, listings, clear, prune --------------------------------------------------------------------


def test_a_queue_s_size_counts_its_groups_and_priorities_everywhere(rb):
    seed_groups(rb, groups={"big": 5, "small": 2})
    rb.zadd(K.lanes(Q).prio, {b'{"priority":5,"jid":"p1"}': 1, b'{"priority":5,"jid":"p2"}': 2})
    api.Queue(Q).pause_group("small")  # (a paused group's jobs still wait)
    Plain.perform_async(1)
    queue = api.Queue(Q)
    assert queue.size() == 10
    assert api.QueueRow.read([queue])[0].size == 10
    stats = api.Stats(days=1)
    assert stats.queue_sizes[Q] == 10 and stats.enqueued == 10
    families = {f.name: f for f in collect()}
    assert ({}, 10) in [(labels, v) for _s, labels, v in families["cogworker_queue_size"].samples
                        if labels.pop("queue") == Q]
    assert [(labels, v) for _s, labels, v in families["cogworker_group_waiting"].samples] == [
        ({"queue": Q, "group": "big"}, 5), ({"queue": Q, "group": "small"}, 2)]
    assert [v for _s, _l, v in families["cogworker_queue_groups"].samples] == [2]
    assert [v for _s, _l, v in families["cogworker_queue_prioritized"].samples] == [2]


def test_a_doorbell_in_the_queue_list_is_no_job_in_its_size(rb):
    Urgent.perform_async(1)  # (the core's push: its priorities' set, and a doorbell into the empty list)
    Urgent.perform_async(2)
    assert any(raw.startswith(b'{"lane":"bell"') for raw in rb.lrange(K.queue(Q), 0, -1))
    assert api.Queue(Q).size() == 2 and api.QueueRow.read([api.Queue(Q)])[0].size == 2
    assert api.Stats(days=1).queue_sizes[Q] == 2
    Plain.perform_async(3)  # (pushed at the other end: the bell still at one end)
    assert api.Queue(Q).size() == 3 and api.Queue(Q).clear() == 3


def test_groups_are_listed_busiest_first_a_page_at_a_time_with_their_total(rb):
    seed_groups(rb, groups={f"g{i:02}": i for i in range(1, 31)})
    api.Queue(Q).pause_group("g05")
    found = api.Queue(Q).groups(1, 25)
    assert found.groups == 30 and found.grouped == sum(range(1, 31)) and found.page.total == 30
    assert [g.id for g in found.page.items[:3]] == ["g30", "g29", "g28"] and len(found.page.items) == 25
    last = api.Queue(Q).groups(2, 25).page.items
    assert [(g.id, g.waiting, g.paused) for g in last] == [
        ("g05", 5, True), ("g04", 4, False), ("g03", 3, False), ("g02", 2, False), ("g01", 1, False)]


def test_clearing_a_queue_clears_its_lanes_and_keeps_its_paused_groups(rb):
    seed_groups(rb, groups={"a": 3, "b": 2})
    rb.zadd(K.lanes(Q).prio, {b'{"priority":1}': 1})
    api.Queue(Q).pause_group("b")
    Plain.perform_async(1)
    assert api.Queue(Q).clear() == 7
    lanes = K.lanes(Q)
    assert not rb.exists(K.queue(Q), lanes.ring, lanes.prio, lanes.group("a"), lanes.group("b"))
    assert rb.smembers(lanes.paused) == {b"b"} and api.Queue(Q).size() == 0


def test_prune_keeps_a_queue_whose_jobs_wait_in_its_lanes(rb):
    seed_groups(rb, groups={"a": 1})
    rb.sadd(K.queues, "empty-one")
    assert api.Queue.prune() == 1
    assert rb.smembers(K.queues) == {Q.encode()}


# -- group limits ---------------------------------------------------------------------------------------


def _limits(redis_url, rb) -> ClassLimits:
    config = make_config(redis_url)
    gate = LimitGate(rb, K, over_limit_max=3, retry=RetryPolicy(config), rng=random.Random(3))
    return ClassLimits(gate, GROUP_LIMITS)


def _before(limits: ClassLimits, tenant: str):
    payload = JobSetter(TenantLimited, {}).build([tenant], {})
    run = JobRun(Unit(json.dumps(payload).encode(), Q), payload, TenantLimited, payload["jid"], "TenantLimited")
    decision = limits.before(run)
    return decision, run.notes.get("limits")


def test_each_group_has_its_own_limiter_key(redis_url, rb):
    limits = _limits(redis_url, rb)
    assert limits.applies(TenantLimited) and not limits.applies(Plain)
    first, held = _before(limits, "acme")
    assert first is None and isinstance(held, Ticket)
    assert [key for _l, key in held.taken] == [f"test:fair:tenant@{Q}/acme"]
    refused, _ = _before(limits, "acme")  # (acme's one place is held)
    assert refused is not None and refused.outcome is Outcome.RESCHEDULED
    other, other_held = _before(limits, "globex")  # (another group: its own place)
    assert other is None and isinstance(other_held, Ticket)
    # The refused job goes back to the schedule with its group still its first field: due, it comes
    # back through the queue's list, and the fetch files it in its group again.
    assert refused.settlement.end.raw().startswith('{"group":"acme",')
    held.release()
    other_held.release()


def test_a_class_with_group_limits_pushed_ungrouped_takes_none(redis_url, rb):
    limits = _limits(redis_url, rb)
    payload = JobSetter(TenantLimited, {"group": None}).build(["acme"], {})
    run = JobRun(Unit(json.dumps(payload).encode(), Q), payload, TenantLimited, payload["jid"], "TenantLimited")
    assert limits.before(run) is None and "limits" not in run.notes


def test_a_limiter_at_a_key_keeps_its_family_and_spec():
    name = unique("fair")
    limiter = Limiter.concurrent(name, 2)
    assert limiter.at("k").name == "k" and limiter.at("k").family == name and limiter.name == name


# -- lane keys of the wrong type ------------------------------------------------------------------------


def test_lane_keys_of_the_wrong_type_are_shown_poisoned_never_raised(rb, capsys):
    from django.core.management import call_command

    seed_groups(rb, groups={"good": 2})
    lanes = K.lanes(Q)
    rb.delete(lanes.ring)
    rb.lpush(lanes.ring, "good", "bad", "")
    rb.set(lanes.group("bad"), "a string")
    rb.set(lanes.prio, "another")
    rb.set(lanes.paused, "and another")
    queue = api.Queue(Q)
    assert queue.size() == 2
    found = queue.groups()
    assert {(g.id, g.poisoned) for g in found.page.items} == {("good", None), ("bad", "holds another type")}
    assert found.poisoned == ["paused (holds another type)", "prio (holds another type)",
                              "group bad (holds another type)"]
    call_command("cogworker", "groups", Q)
    out = capsys.readouterr()
    assert "poisoned (holds another type)" in out.out and "poisoned lane keys" in out.err
    call_command("cogworker", "queues")
    assert Q in capsys.readouterr().out
    assert any(f.name == "cogworker_group_waiting" for f in collect())
    rb.delete(lanes.ring)
    rb.set(lanes.ring, "a string ring")
    assert api.Queue(Q).size() == 0 and api.Queue(Q).groups().poisoned[0] == "ring (holds another type)"


def test_the_key_guard_moves_lane_keys_of_the_wrong_type_aside(rb):
    seed_groups(rb, groups={"good": 1})
    lanes = K.lanes(Q)
    rb.lpush(lanes.ring, "bad")
    rb.set(lanes.group("bad"), "a string")
    rb.sadd(K.paused_queues, "other")
    other = K.lanes("other")
    rb.set(other.prio, "x")
    rb.set(other.paused, "y")
    moved = KeyGuard(rb, K, [Q]).check()
    assert sorted(moved) == sorted([lanes.group("bad"), other.prio, other.paused])
    assert rb.type(lanes.group("good")) == b"list" and rb.type(lanes.ring) == b"list"
    rb.delete(lanes.ring)
    rb.set(lanes.ring, "z")
    assert KeyGuard(rb, K, [Q]).check() == [lanes.ring]


def test_the_cli_pauses_and_resumes_groups_and_lists_them(rb, capsys):
    from django.core.management import call_command

    seed_groups(rb, groups={"acme": 3, "globex": 1})
    call_command("cogworker", "pause", Q, "--group", "acme", "--skip-checks")
    assert "fair-fast group acme: paused" in capsys.readouterr().out
    assert rb.smembers(K.lanes(Q).paused) == {b"acme"}
    call_command("cogworker", "groups", Q, "--json")
    document = json.loads(capsys.readouterr().out)
    assert [(i["group"], i["waiting"], i["paused"]) for i in document["items"]] == [
        ("acme", 3, True), ("globex", 1, False)]
    call_command("cogworker", "resume", Q, "--group", "acme", "--skip-checks")
    assert "fair-fast group acme: resumed" in capsys.readouterr().out and not rb.exists(K.lanes(Q).paused)


# -- with the core's fetch: what the options write is what it takes turns over ---------------------------


def test_jobs_pushed_with_a_group_are_counted_and_paused_in_their_group_as_the_core_s_fetch_files_them(
        redis_url, rb):
    from django_cogworker.broker.connection import make_redis
    from django_cogworker.engine.fetch.reliable import ReliableFetch

    client = make_redis(make_config(redis_url, REDIS_OPTIONS={}))
    fetch = ReliableFetch(make_config(redis_url, QUEUES=[Q], REDIS_OPTIONS={}), client, K, "host:1:fair",
                          rng=random.Random(1))
    ByArg.perform_bulk([["big"]] * 20 + [["small"]] * 3)
    Plain.perform_async(0)
    taken = [json.loads(u.raw) for u in fetch.retrieve(4)]  # (its fetch files the grouped ones in their lists)
    assert api.Queue(Q).size() == 24 - len(taken)
    counts = {g.id: g.waiting for g in api.Queue(Q).groups().page.items}
    assert sum(counts.values()) + rb.llen(K.queue(Q)) == 24 - len(taken) and set(counts) == {"big", "small"}
    api.Queue(Q).pause_group("small")
    rest = []
    while units := fetch.retrieve(5):
        rest += [json.loads(u.raw) for u in units]
    assert all(p.get("group") != "small" for p in rest)  # (paused: none taken)
    assert [(g.id, g.paused) for g in api.Queue(Q).groups().page.items if g.waiting] == [("small", True)]
    api.Queue(Q).resume_group("small")
    resumed = []
    while units := fetch.retrieve(5):
        resumed += [json.loads(u.raw) for u in units]
    small_left = 3 - sum(p.get("group") == "small" for p in taken)
    assert [p.get("group") for p in resumed] == ["small"] * small_left and api.Queue(Q).size() == 0
    client.close()
