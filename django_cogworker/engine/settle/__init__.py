"""Settling a finished job: acknowledged, retried with backoff, or dead, and counted.

    settlement   what settles a job: ACK, a Filing, or a feature's step before either
    settling     filings in retry or dead, what is pending, the hand-off at shutdown
    acks         the acks (and features' steps) held for the fetcher's next round trip
    ride         what rides one fetch's round trip: held steps on its pipeline
    retry        the retry policy: backoff, dead, discard
    stats        processed and failed counters, counted in memory, flushed every beat
"""
