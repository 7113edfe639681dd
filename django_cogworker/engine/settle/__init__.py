"""Settling a finished job: acknowledged, retried with backoff, or dead, and counted.

    settling     acks in batches, filings in retry or dead, what is pending, the hand-off at shutdown
    retry        the retry policy: backoff, dead, discard
    stats        processed and failed counters, counted in memory, flushed every beat
"""
