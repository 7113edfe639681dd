"""A job past its ``expires_in``, dropped unrun at fetch and counted (``stat:expired``; docs/flow-control.md).

    hook         Expiry: the core's ``before`` phase, a Decision to drop the job (dead for its batch,
                 FAILED for its result)
"""
