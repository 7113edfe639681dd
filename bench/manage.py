#!/usr/bin/env python
"""manage.py of the bench project: `python bench/manage.py runcogworker -c 10` works from anywhere."""

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

if __name__ == "__main__":
    for path in (str(BENCH.parent), str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
