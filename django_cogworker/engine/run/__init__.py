"""Running a job: the processor thread and what it does around ``perform``.

    processor    a fetched job through its phases: before, run (around), decide, settling, settle, after
    hooks        the phases features plug into, and each job class's Plan of them
    outcomes     the typed values the phases pass: Outcome, Decision, JobRun
    interrupts   how a running job is stopped: an exception in its thread, or its task cancelled
    failures     the failure path's own helpers: a dead entry when a filing failed, safe logging
    factories    the features a worker makes: COGWORKER["FEATURES"] loaded, checked and called
    tracebacks   a failed job's traceback from the user's code in, for its log line and its backtrace
    timeouts     a job past its timeout interrupted in its thread, or its process replaced
    cancels      the cancel requests each heartbeat reads, told to the runs concerned
    run_locks    a job's unique and periodic locks, released as it ends, even through an outage
    db           Django database hygiene around each job, as around a request

(The job's log context, jid and class on every record, is the root's ``joblog``: projects name
its filter in their LOGGING.)
"""
