"""django-cogworker: reliable Sidekiq-style background jobs on Redis for Django.

What a project imports is here. The package is laid out by who uses it (docs/architecture.md):
``push/`` is what a view calls, ``engine/`` is ``runcogworker``, ``broker/`` is Redis, ``api/`` the
object model the admin and the CLI read, ``features/`` a folder per feature (batches, limits,
cancellation, results, expiry), and the root holds the Django app itself.
"""

from . import _moved
from .batches import Batch, chain, chord, group
from .declarations import PushOutcome
from .errors import (
    BatchError,
    BatchNotFound,
    Cancelled,
    CogworkerError,
    ConfigError,
    InvalidArgument,
    JobExpired,
    JobNotFound,
    JobTimeout,
    LimitKeyError,
    OverLimit,
    PayloadError,
    PushLostAtCommit,
    UnknownJobError,
    WrongTypeError,
)
from .features.cancellation import cancel
from .features.iteration import IterableJob
from .features.limits import Limiter
from .features.progress import get_progress
from .features.results import get_result
from .push.job import Job, JobSetter
from .push.periodic import periodic
from .push.runtime import get_redis

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchError",
    "BatchNotFound",
    "Cancelled",
    "CogworkerError",
    "ConfigError",
    "InvalidArgument",
    "IterableJob",
    "Job",
    "JobExpired",
    "JobNotFound",
    "JobSetter",
    "JobTimeout",
    "LimitKeyError",
    "Limiter",
    "OverLimit",
    "PayloadError",
    "PushLostAtCommit",
    "PushOutcome",
    "UnknownJobError",
    "WrongTypeError",
    "__version__",
    "cancel",
    "chain",
    "chord",
    "get_progress",
    "get_redis",
    "get_result",
    "group",
    "periodic",
]

_moved.install()
