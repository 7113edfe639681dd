"""Running a job: the processor thread and what it does around ``perform``.

    processor    a fetched job through the server middleware, then handed to settling
    extras       what runs around a job that opts in to a result record or a timeout
    timeouts     a job past its timeout interrupted in its thread, or its process replaced
    results      recording the result of the jobs that keep one
    run_locks    a job's unique and periodic locks, released as it ends, even through an outage
    db           Django database hygiene around each job, as around a request

(The job's log context, jid and class on every record, is the root's ``joblog``: projects name
its filter in their LOGGING.)
"""
