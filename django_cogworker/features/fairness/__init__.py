"""Fair shares within a queue: ``group`` (the queue's groups take turns), ``priority`` (higher first)
and ``group_limits`` (the fleet-wide limiters, per group). docs/fairness.md.

The fetch that takes the turns and orders the priorities is the core's (engine/fetch/, over the
lanes broker/keys/families.py names); this folder holds what is around it:

    options      the options' checks, and how a push's group id is read from its arguments
    declaration  the options declared, the push hook (``group``/``priority`` as the first field)
    limits       group_limits: each group its own limiter key, taken with the class's limits
    scripts      PAUSE_GROUP, RESUME_GROUP
    api          a queue's groups (busiest first), pause and resume one (``api.Queue.pause_group``)
    cli          ``cogworker groups QUEUE``, ``cogworker pause QUEUE --group G``
    (admin)      the queue page's Groups table: templates/admin/cogworker/fairness/groups.html; its
                 Pause/Resume buttons post to the queues page (admin/views.py), which acts through api.Queue
    metrics      cogworker_queue_groups, cogworker_group_waiting (the busiest groups only)
"""
