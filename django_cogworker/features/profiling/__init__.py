"""A job run under a profiler on request, kept a day (docs/observability.md#profiling).

``MyJob.set(profile="why-slow").perform_async(...)`` (or "Run profiled" on a scheduled, retry or
dead entry in the admin) puts the label in the payload's ``profile`` field; a worker runs that
job under pyinstrument when it is importable (the ``profile`` extra), else the standard library's
cProfile, and keeps what it found in Redis for a day: the label, the job, its times, its error if
it raised, the top functions by cumulative time and pyinstrument's HTML page.

Never on by default, and nothing for a job not asked: the hook names its field
(``Feature.fields``), so a payload without it runs through its class's plan without this feature.

    declaration  the ``profile`` push option, checked, and put in the payload as it is pushed
    profilers    cProfile and pyinstrument behind one small interface; another profiler already
                 active on the thread leaves the run unprofiled, never failed
    hook         Profiling: the core's ``around`` phase, the innermost feature (it times the job)
    records      a profile in Redis (``profile:<id>``, index ``profiles``): written, read, trimmed
    api          what the admin and the CLI use: the list, one profile, its HTML, "run profiled"
    admin_views  the Profiles page, a profile's page, its HTML (sandboxed), the button's endpoint
    cli          ``manage.py cogworker profiles [--json]`` and ``profiles show ID``
"""
