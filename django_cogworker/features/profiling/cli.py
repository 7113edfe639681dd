"""``manage.py cogworker profiles [--json]`` (the profiles kept, the newest first) and
``cogworker profiles show ID [--json]`` (one, with its top functions)."""

from __future__ import annotations

import time

from django.core.management.base import CommandError

from ...cli.listings import Listing
from ...cli.output import FAILED
from ...push.payload import printable
from . import api


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def listing(page: int = 1, limit: int = api.PER_PAGE) -> Listing:
    result = api.profiles(page, limit)
    rows = [[p.id, printable(p.label), printable(p.job_class), p.jid, _when(p.started), f"{p.elapsed:.3f}s",
             p.profiler or "unprofiled", printable(p.error, 80)] for p in result.items]
    document = {"profiles": [p.document(top=False) for p in result.items], "page": result.number,
                "total": result.total}
    note = None
    if not rows:
        note = "no profile kept (push a job with set(profile=LABEL); profiles are kept a day)"
    elif result.has_next:
        note = f"page {result.number} of {result.pages}: --page for more"
    return Listing(["ID", "LABEL", "CLASS", "JID", "STARTED (UTC)", "ELAPSED", "PROFILER", "ERROR"], rows, document,
                   note)


def show(ident: str) -> Listing:
    found = api.profile(ident)
    if found is None:
        raise CommandError(f"no profile {ident!r} (profiles are kept a day)", returncode=FAILED)
    rows = [[printable(row.get("function"), 120), printable(row.get("where"), 200),
             "-" if row.get("calls") is None else row.get("calls"), f"{row.get('cumtime', 0):.4f}",
             f"{row.get('tottime', 0):.4f}"] for row in found.top]
    said = (f"{printable(found.label)}: {printable(found.job_class)} {found.jid}, attempt {found.attempt}, "
            f"{found.elapsed:.3f}s, {found.profiler or 'unprofiled: ' + found.skipped}")
    if found.error:
        said += f"; raised {printable(found.error, 200)}"
    return Listing(["FUNCTION", "WHERE", "CALLS", "CUMTIME S", "TOTTIME S"], rows, found.document(), said)
