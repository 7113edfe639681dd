"""Jobs that run later: the scheduled and retry sets, and periodic (cron) entries.

    poller            due scheduled and retry entries to their queues, plus the fleet's housekeeping
    due               the due sweep itself (one script per batch), poison to dead
    wakeups           the poller's subscription to due times as they are published
    periodic_ticker   every process ticks; each slot of an entry runs once fleet-wide
    periodic_claims   the slot claim that makes it once
"""
