"""The push side: what a view, a shell or a job calls to send work to the workers.

    job          Job, JobSetter, the registry of job classes (``perform_async``, ``perform_in``, ``set``)
    arguments    what a job may be sent: JSON-native arguments, checked at push time
    payload      a job's wire format: encode, decode, the rules for reading one
    client       Client: one push, a bulk push, now or scheduled, through the client middleware
    unique       unique jobs: the claim that keeps a second copy out
    middleware   client and server middleware chains
    results      a job's result record, for the jobs that keep one (``get_result``)
    periodic     periodic (cron) entries, declared in settings or with ``@periodic``
    runtime      the process-wide config and clients, built lazily from Django settings
"""
