"""django-cogworker: reliable Sidekiq-style background jobs on Redis for Django."""

from .errors import CogworkerError, ConfigError, JobTimeout, PayloadError, UnknownJobError, WrongTypeError
from .job import Job, JobSetter
from .periodic import periodic

__version__ = "0.1.0"

__all__ = [
    "CogworkerError",
    "ConfigError",
    "Job",
    "JobSetter",
    "JobTimeout",
    "PayloadError",
    "UnknownJobError",
    "WrongTypeError",
    "__version__",
    "periodic",
]
