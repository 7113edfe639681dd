"""The event loop of a worker process, for the jobs whose ``perform`` is ``async def``.

    runner   the ``cogworker-loop`` thread: up to ASYNC_CONCURRENCY jobs at once, each in a task
             through the processor's phases (``Processor.process_async``); handed back at stop
    lag      the ``cogworker-loop-lag`` thread: a job holding the loop named in the log
"""
