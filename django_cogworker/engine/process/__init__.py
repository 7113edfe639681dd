"""One worker process and the fleet of them.

    launcher     builds one worker process's parts from the config and runs them until told to stop
    manager      this process's processors, fetcher, ledger and settling, and their lifecycle
    heartbeat    this process's presence in Redis, and the chores that ride on each beat
    supervisor   ``runcogworker --processes N``: forks N worker processes and keeps them running
    affinity     CPU affinity of worker processes
    confine      a process left free kept on one CPU while bound by its GIL
"""
