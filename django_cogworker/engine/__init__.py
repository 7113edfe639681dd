"""The worker engine: ``runcogworker``'s processes, threads and the stages a job goes through.

No Django import at module level; every object is handed a Config. One folder per stage:

    process/     launcher (builds one worker process), manager (its threads), heartbeat,
                 supervisor (``--processes N``), affinity (CPU pinning), confine (one CPU
                 while bound by the GIL)
    fetch/       the fetch contract and its strategies (reliable, basic, sharded on a cluster),
                 the fetcher thread, the ledger of jobs held, the routing between threads and loop
    run/         the processor thread: a job through the server middleware, with its
                 timeout, result record, locks, database hygiene and log context
    loop/        the event loop running async jobs through the same phases, and its lag watch
    settle/      what becomes of a finished job: acked, retried with backoff, or dead; counters
    schedule/    the poller (due scheduled and retry entries), its wake-ups, the periodic ticker
    recovery/    orphan recovery, the key guard, the poller's housekeeping round
    loops        every thread's loop kept alive through outages and bugs
"""
