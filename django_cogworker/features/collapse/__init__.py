"""Pushes that collapse: ``debounce``, ``throttle`` and ``keep_last_if_active`` (docs/fairness.md).
declaration.py: the options, the push hook and the ``died`` hand-over; writer.py: the push's write
(through the outbox's hand-over too, with its mark); scripts.py: its Lua; hook.py: the run's part
(keep_last's start, refresh and end, debounce's start)."""
