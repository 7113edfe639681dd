"""Settling a finished job: acknowledged, retried with backoff, or dead, and counted.

    settlement   what settles a job: one Settlement, its end (ACK or a Filing) after its features' steps
    queue        the SettlementQueue: settlements held for the fetcher's next round trip, or sent at once
    outgoing     what one fetch carries: the acks in its script's arguments, held steps on its pipeline
    settling     the Settler: what goes alone (filings), what is pending, the hand-off at shutdown
    retry        the retry policy: backoff, dead, discard
    stats        processed and failed counters, counted in memory, flushed every beat
"""
