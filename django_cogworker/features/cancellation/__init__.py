"""Cancelling a job (docs/flow-control.md): ``cancel(jid)``.

    cancel       a request in ``cancels``, then the job taken off where it waits, or found running
    admin_views  the Cancel button's view (``busy/cancel/``; templates/admin/cogworker/cancellation/)

A running job is stopped by its worker: engine/run/cancels.py (for now).
"""

from .cancel import cancel

__all__ = ["cancel"]
