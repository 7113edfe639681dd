"""Recovering from what went wrong elsewhere: dead processes' jobs, keys of the wrong type.

    orphans        requeue the in-progress lists of processes that died (``max_orphanings``)
    key_guard      move keys holding the wrong type out of the way (quarantine)
    housekeeping   the poller's round of both, and of unsettled jobs
    registry       the fleet's registries read leniently: a member no worker wrote is skipped and said
"""
