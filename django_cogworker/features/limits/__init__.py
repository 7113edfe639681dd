"""Limiters across the fleet (docs/flow-control.md).

    limiter      Limiter: the four kinds, key functions, ``within()``; what this process holds
    upkeep       the heartbeat's part: leases renewed, keys indexed; the lease check (cogworker.E004)
    scripts      the Lua: take a place, give it back, keep a lease
    api          LimitSet, LimitState...: the object model the admin and the CLI read
    admin_views  the admin's Limits pages (templates/admin/cogworker/limits/)
    metrics      what a scrape reads of limiters

The processor's side, before a job runs, is engine/run/gate.py (for now).
"""

from .limiter import Limiter

__all__ = ["Limiter"]
