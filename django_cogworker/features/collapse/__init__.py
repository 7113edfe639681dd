"""Pushes that collapse: ``debounce``, ``throttle`` and ``keep_last_if_active`` (docs/fairness.md).
declaration.py: the options and the push hook; writer.py: the push's write; scripts.py: its Lua;
hook.py: keep_last_if_active's part of a run."""
