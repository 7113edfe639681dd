# For mypy only, while the worker's core still imports this old path (at run time
# django_cogworker/_moved.py serves it as features/batches/steps.py): goes with its QUIET entry.
from ..features.batches.steps import BatchStep as BatchStep
from ..features.batches.steps import BatchSteps as BatchSteps
from ..features.batches.steps import step_for as step_for
