"""Limiters across the fleet (docs/flow-control.md).

    limiter      Limiter: the four kinds, key functions, ``within()``; what this process holds
    upkeep       the heartbeat's part: leases renewed, keys indexed; the lease check (cogworker.E004)
    scripts      the Lua: take a place, give it back, keep a lease
    api          LimitSet, LimitState...: the object model the admin and the CLI read
    admin_views  the admin's Limits pages (templates/admin/cogworker/limits/)
    metrics      what a scrape reads of limiters

    gate         LimitGate: a job's places taken before its run (or it rescheduled with a backoff),
                 given back with its ack (Release)
    held         what this process holds and has seen; a fetch's takes and releases packed into one
                 script call each (Packing, Release, Releases)
    hook         ClassLimits, InlineLimits: the gate on the core's phases; the leases' heartbeat chore
"""

from .limiter import Limiter

__all__ = ["Limiter"]
