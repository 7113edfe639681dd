"""The fetch strategies by name: the one place that knows them all.

The strategies import the contract (contract.py) and nothing here; this module imports them, so
the arrow goes one way and each strategy can be read, tested or replaced alone.
"""

from __future__ import annotations

from ...broker.keys import Keys
from ...broker.types import RedisClient
from ...conf import Config
from .basic import BasicFetch
from .contract import Fetch
from .reliable import ReliableFetch
from .sharded import ShardedBasicFetch, ShardedReliableFetch

# (config.fetch, on a cluster) -> strategy. A cluster gives each queue its own slot (keys.spread),
# which the sharded strategies follow; a lone Redis never runs their code.
STRATEGIES: dict[tuple[str, bool], type[Fetch]] = {
    ("reliable", False): ReliableFetch,
    ("basic", False): BasicFetch,
    ("reliable", True): ShardedReliableFetch,
    ("basic", True): ShardedBasicFetch,
}


def make_fetch(config: Config, redis: RedisClient, keys: Keys, identity: str) -> Fetch:
    """The strategy ``config.fetch`` names, for a lone Redis or a cluster."""
    return STRATEGIES[(config.fetch, keys.spread)](config, redis, keys, identity)
