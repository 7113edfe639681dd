"""What the cancellation feature declares (django_cogworker/declarations.py): the class option ``cancellable``,
and the functions behind ``Job.cancel`` and ``Job.cancelled`` (cancel.py).

``cancellable``: False for the package's hand-over jobs (batches/: a chain's next step, a child
batch telling its parent): a chain or a batch waits for each, and cancelled, it waited for ever.
``cancel`` refuses them (NotCancellable, saying why: ``Job.cancel_refusal``); a worker ignores a
request for one.
"""

from __future__ import annotations

from typing import Any

from ...declarations import Declaration, Option


def _cancel(jid: str, interrupt: bool = False) -> str:
    from .cancel import cancel  # (imported with the package anyway: read on the first cancel)

    return cancel(jid, interrupt=interrupt)


def _asked(payload: dict[str, Any]) -> bool:
    from .cancel import asked

    return asked(payload)


DECLARATION = Declaration("cancellation", options=(Option("cancellable", True),),
                          provides={"cancel": _cancel, "cancel_asked": _asked})
