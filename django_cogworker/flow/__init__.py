"""Flow control across the fleet: limiters (limiter.py) and what a worker's heartbeat keeps for
them (upkeep.py), cancelling a job (cancel.py). The processor's side, before a job runs, is
engine/run/gate.py (expiry, cancel requests, limits) and engine/run/cancels.py."""

from .cancel import cancel
from .limiter import Limiter

__all__ = ["Limiter", "cancel"]
