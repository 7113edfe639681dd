"""The public path of batches and workflows: ``from django_cogworker.batches import Batch``.

The code is in features/batches/ (docs/batches.md).
"""

from ..features.batches import (
    Batch,
    BatchChildDone,
    BatchStatus,
    Chain,
    ChainNext,
    Chord,
    Group,
    Signature,
    chain,
    chord,
    group,
)

__all__ = ["Batch", "BatchStatus", "BatchChildDone", "Chain", "ChainNext", "Chord", "Group", "Signature",
           "chain", "chord", "group"]
