"""Marks a test job leaves in a file, outside Redis (a kill -9 of Redis or of the worker keeps them):
FileMarkJob's, PeriodicFileJob's and the iterable jobs' of long_jobs.py."""

from __future__ import annotations

import os


def append_line(path: str, line: str) -> None:
    """One write() per line on an O_APPEND descriptor: lines from concurrent threads and processes
    never interleave, and each is whole."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
