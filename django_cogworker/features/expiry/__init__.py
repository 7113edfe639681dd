"""A job past its ``expires_in``, dropped unrun at fetch and counted (``stat:expired``; docs/flow-control.md).

Empty for now: the check is engine/run/gate.py's, until it becomes this feature's hook on the
core's before-run phase.
"""
