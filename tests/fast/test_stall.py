"""The stall watch (engine/fetch/stall.py): which jobs a process may start without asking whether
they are still its own, on a clock the test moves.

A job taken before this process may have been taken for dead (a beat landing after the previous
one's term ran out), or any job while the term has run out, is asked about; every other job
starts at once. The fetch's answer and the end-to-end runs are in test_fetch.py, test_fetcher.py
and test_faults.py.
"""

from __future__ import annotations

import math

import pytest

from django_cogworker.engine.fetch.stall import TERM_SHARE, StallWatch

THRESHOLD = 10.0
TERM = THRESHOLD * TERM_SHARE


@pytest.fixture
def now():
    return [100.0]


@pytest.fixture
def watch(now):
    return StallWatch(THRESHOLD, clock=lambda: now[0])


def test_nothing_is_vouched_for_before_the_first_beat(watch, now):
    assert not watch.covers(now[0] - 1) and not watch.covers(now[0])


def test_a_beat_vouches_for_the_jobs_taken_after_it_until_its_term_runs_out(watch, now):
    watch.stamped(sent=now[0])
    now[0] += 0.5
    assert watch.covers(now[0] - 0.1)
    now[0] = 100.0 + TERM - 0.01
    assert watch.covers(100.4)
    now[0] = 100.0 + TERM
    assert not watch.covers(now[0] - 0.1)  # the term ran out: even a job just taken is asked about


def test_beats_within_their_term_keep_every_job_covered(watch, now):
    watch.stamped(sent=now[0])
    taken = now[0] + 0.1
    for _ in range(20):
        now[0] += TERM / 2
        watch.stamped(sent=now[0] - 0.01)
        assert watch.covers(taken)


def test_a_beat_landing_after_the_term_ran_out_leaves_every_job_taken_before_it_to_be_asked_about(watch, now):
    watch.stamped(sent=now[0])
    before_the_stall = now[0] + 1
    now[0] += THRESHOLD + 5  # stalled: others may have taken this process for dead
    just_woken = now[0] - 0.01  # (taken after waking, before its beat landed: the others could still act)
    watch.stamped(sent=now[0] - 0.02)
    now[0] += 0.01
    assert not watch.covers(before_the_stall) and not watch.covers(just_woken)
    assert watch.covers(now[0])  # taken after the beat that ended the lapse


def test_a_fetch_whose_jobs_no_one_else_can_take_back_never_asks(now):
    # Basic fetch: what it took lives only in its memory.
    watch = StallWatch(math.inf, clock=lambda: now[0])
    assert watch.covers(0.0)
    now[0] += 1e9
    watch.stamped(sent=now[0])
    assert watch.covers(0.0)
