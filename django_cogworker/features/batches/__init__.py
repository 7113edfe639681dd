"""Batches and the workflows built on them (docs/batches.md).

    batch        Batch: jobs pushed together, callbacks on complete, success, death; its status
    steps        the worker's side: a job of a batch settles its batch step before its ack
    delivery     fired callbacks, from the batch's outbox to their queues, each once
    workflows    chain, group, chord: thin helpers over batches
    scripts      the Lua of every step that moves a batch's counters
    api/         the object model the admin and the CLI read: BatchSet (the listing), and
                 detail.py: one batch (BatchSummary, BatchDetail)
    admin_views  the admin's Batches pages (templates/admin/cogworker/batches/)
    metrics      what a scrape reads of batches

``django_cogworker.batches`` is the public path of the names below.
"""

from .batch import Batch, BatchStatus
from .steps import BatchChildDone
from .workflows import Chain, ChainNext, Chord, Group, Signature, chain, chord, group

__all__ = ["Batch", "BatchStatus", "BatchChildDone", "Chain", "ChainNext", "Chord", "Group", "Signature",
           "chain", "chord", "group"]
