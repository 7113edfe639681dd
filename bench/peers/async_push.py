"""Push ``n`` awaiting jobs to an async peer, in that peer's venv (its library and redis-py's version
are its own: arq's and taskiq-redis's can't share one venv): ``python -m peers.async_push arq 20000 0.001``.
Each peer's own enqueue call, 500 at a time with ``asyncio.gather`` (none has a bulk push)."""

import asyncio
import importlib
import sys


def main(argv):
    peer, n, seconds = argv[0], int(argv[1]), float(argv[2])
    jobs = importlib.import_module(f"peers.{peer}_jobs")
    asyncio.run(jobs.push(n, seconds))


if __name__ == "__main__":
    main(sys.argv[1:])
