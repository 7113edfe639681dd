"""The filings the processor makes for a failure its own path had to make: a dead entry when a job's
filing failed, and the words a failure's log line says of where it went."""

from __future__ import annotations

import time

from ...push import payload as payloads
from ..settle.retry import Filing


def fate_of(filing: Filing | None) -> str:
    """Where a failed job went, for its log line: "retry 1 in 17s", "dead: retries exhausted"."""
    if filing is None:
        return "discarded: dead=False"
    if filing.target == "retry":
        return f"retry {filing.payload.get('retry_count', 0) + 1} in {max(filing.score - time.time(), 0):.0f}s"
    return f"dead: {filing.payload.get('dead_reason', '')}"


def dead_filing(raw: bytes, reason: str, exc: BaseException | None) -> Filing:
    """A dead entry for a job whose own filing failed: its payload as pushed (not as the job left
    it), with the error and the reason; kept as it came if it can't be written back (1e309 in its
    args reads as inf), the raw bytes in a dead letter if it can't even be read."""
    now = time.time()
    try:
        payload = payloads.decode(raw)
        payload.update(error_class=payloads.error_class(exc) if exc is not None else "CogworkerError",
                       error_message=payloads.error_message(exc) if exc is not None else reason,
                       failed_at=now, dead_reason=payloads.safe_string(reason, payloads.ERROR_MESSAGE_LIMIT))
        filing = Filing("dead", now, payload)
        try:
            filing.raw()
        except ValueError:  # (a number JSON can't hold)
            filing = filing.as_stored(raw)
        return filing
    except BaseException:  # noqa: BLE001 - unreadable: keep the bytes
        return Filing("dead", now, payloads.dead_letter(raw, reason, now))
