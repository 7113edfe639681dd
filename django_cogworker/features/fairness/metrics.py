"""What a scrape shows of the queues' groups, from the lanes the scrape's Stats read (metrics/collect.py
hands it over: nothing is read again): per queue, how many groups it has and how many jobs wait
with a priority; per group, the jobs waiting, for the
GROUP_LIMIT busiest groups over all queues only. A group is usually a tenant: one series per group
would be 100,000 series a scrape for 100,000 customers, more than a Prometheus server should keep,
and the busy ones are those an operator looks for (the admin's and the CLI's listings show the
rest, paged). The queues' sizes (``cogworker_queue_size``) count the groups' jobs already.
"""

from __future__ import annotations

from ...api.lanes import rank
from ...api.stats import Stats
from ...metrics.exposition import Family

GROUP_LIMIT = 100  # groups with a series of their own, the most waiting first


def families(stats: Stats) -> list[Family]:
    """The families, from the lanes ``stats`` read (each queue's, with its GROUP_LIMIT busiest: the
    busiest over all queues are among them)."""
    count = Family("cogworker_queue_groups", "gauge", "Groups of the queue with jobs waiting or paused.")
    paused = Family("cogworker_queue_groups_paused", "gauge", "Groups of the queue paused (their jobs wait).")
    prioritized = Family("cogworker_queue_prioritized", "gauge", "Jobs of the queue waiting with a priority.")
    waiting = Family("cogworker_group_waiting", "gauge",
                     f"Jobs waiting in the group, for the {GROUP_LIMIT} busiest groups over all queues only.")
    busiest: list[tuple[int, str, str]] = []
    for member, lanes in sorted(stats.lanes.items()):
        if not lanes.group_count and not lanes.prioritized:
            continue  # (a queue with no lanes has no series here: most queues)
        name = member.decode("utf-8", "backslashreplace")
        count.add(lanes.group_count, queue=name)
        paused.add(lanes.paused_count, queue=name)
        prioritized.add(lanes.prioritized, queue=name)
        busiest += [(group.waiting, name, group.id.decode("utf-8", "backslashreplace"))
                    for group in sorted(lanes.busiest, key=rank)]
    for size, queue_name, group in sorted(busiest, key=lambda t: (-t[0], t[1], t[2]))[:GROUP_LIMIT]:
        waiting.add(size, queue=queue_name, group=group)
    return [count, paused, prioritized, waiting]
