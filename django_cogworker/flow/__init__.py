"""Flow control across the fleet: limiters (limiter.py) and what a worker's heartbeat keeps for
them (upkeep.py), cancelling a job (cancel.py). The processor's side, before a job runs, is
features/expiry, features/cancellation and features/limits."""

from .cancel import cancel
from .limiter import Limiter

__all__ = ["Limiter", "cancel"]
