# For mypy only, while engine/run/results.py still imports this old path (at run time
# django_cogworker/_moved.py serves it as features/results/records.py): goes with its QUIET entry.
from ..features.results.records import *  # noqa: F403
