"""What a scrape reads of the queues' groups (metrics/collect.py calls it): per queue, how many
groups it has and how many jobs wait with a priority; per group, the jobs waiting, for the
GROUP_LIMIT busiest groups over all queues only. A group is usually a tenant: one series per group
would be 100,000 series a scrape for 100,000 customers, more than a Prometheus server should keep,
and the busy ones are those an operator looks for (the admin's and the CLI's listings show the
rest, paged). The queues' sizes (``cogworker_queue_size``) count the groups' jobs already.
"""

from __future__ import annotations

from ... import api
from ...api import lanes as lane_counts
from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...metrics.exposition import Family

GROUP_LIMIT = 100  # groups with a series of their own, the most waiting first


def families(redis: RedisClient, keys: Keys) -> list[Family]:
    queues = api.Queue.all(redis=redis, keys=keys)
    read = lane_counts.read(redis, [q.key for q in queues])
    count = Family("cogworker_queue_groups", "gauge", "Groups of the queue with jobs waiting or paused.")
    paused = Family("cogworker_queue_groups_paused", "gauge", "Groups of the queue paused (their jobs wait).")
    prioritized = Family("cogworker_queue_prioritized", "gauge", "Jobs of the queue waiting with a priority.")
    waiting = Family("cogworker_group_waiting", "gauge",
                     f"Jobs waiting in the group, for the {GROUP_LIMIT} busiest groups over all queues only.")
    busiest: list[tuple[int, str, str]] = []
    for queue, lanes in zip(queues, read, strict=True):
        if not lanes.groups and not lanes.paused and not lanes.prioritized:
            continue  # (a queue with no lanes has no series here: most queues)
        count.add(len(set(lanes.groups) | lanes.paused), queue=queue.name)
        paused.add(len(lanes.paused), queue=queue.name)
        prioritized.add(lanes.prioritized, queue=queue.name)
        busiest += [(size, queue.name, group.decode("utf-8", "backslashreplace"))
                    for group, size in lanes.groups.items()]
    for size, queue_name, group in sorted(busiest, key=lambda t: (-t[0], t[1], t[2]))[:GROUP_LIMIT]:
        waiting.add(size, queue=queue_name, group=group)
    return [count, paused, prioritized, waiting]
