#!/usr/bin/env python
"""manage.py of the bench project: `python bench/manage.py runcogworker -c 10` works from anywhere.

BENCH_COGWORKER_TREE: a directory holding another django_cogworker to run (run.py --baseline: a git
revision's, unpacked), put first on the path instead of this work tree.
"""

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

if __name__ == "__main__":
    # (First on the path, ahead of PYTHONPATH: the baseline's tree was given there once, and this
    # work tree, put in front of it here, ran in its place.)
    tree = os.environ.get("BENCH_COGWORKER_TREE") or str(BENCH.parent)
    for path in (tree, str(BENCH)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
