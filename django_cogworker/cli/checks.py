"""What ``manage.py cogworker`` checks before an action: what the action needs, no more.

Every action ran every system check first, as a Django command does by default: with
``encrypt = True`` and no key yet, cogworker.E020 said to run ``cogworker genkey`` and refused
that very command (``--skip-checks`` was only taken before the action's name), and any config
error locked the operator out of ``stats``. Now:

- ``genkey`` checks nothing: it needs neither Redis nor the settings.
- A listing reads the settings that say where to look (REDIS_URL, REDIS_OPTIONS, KEY_PREFIX) and
  runs no system check. Another setting with a wrong value is set aside: its default is read in
  its place and the command says so on stderr (``manage.py check`` says what is wrong).
- An action that changes something (pause, clear, retry, delete, cancel, quiet, stop) runs every
  system check first: it acts on jobs and processes the config may be wrong about.

``--skip-checks`` is taken before or after the action's name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.management.base import CommandError

from ..conf import Config, build_config
from ..errors import ConfigError
from .output import FAILED

# The settings a listing can't do without: where Redis is, how to connect, where its keys are.
NEEDED = ("REDIS_URL", "REDIS_OPTIONS", "KEY_PREFIX")
_NAMED = re.compile(r'COGWORKER\["([^"\]]+)"\]')


def reading_config(raw: Any, environ: Mapping[str, str]) -> tuple[Config, list[str]]:
    """The config a listing reads with, and the errors of the settings set aside for it (none when
    every setting is right). CommandError (exit FAILED) when a setting it needs is wrong."""
    try:
        return build_config(raw, environ), []
    except ConfigError as exc:
        errors = list(exc.errors)
    wrong = {name for error in errors for name in _NAMED.findall(error)}
    if isinstance(raw, Mapping) and wrong and not wrong & set(NEEDED):
        try:
            return build_config({k: v for k, v in raw.items() if k not in wrong}, environ), errors
        except ConfigError:
            pass  # (a setting that is wrong only beside another: say everything)
    raise CommandError("COGWORKER can't be read:\n" + "\n".join(errors), returncode=FAILED)


def set_aside_note(errors: list[str]) -> str:
    """What stderr says when a listing read some settings' defaults in place of their wrong values."""
    names = sorted({name for error in errors for name in _NAMED.findall(error)})
    return (f"warning: COGWORKER has errors (`manage.py check` lists them); read with the default of "
            f"{', '.join(names)}:\n" + "\n".join(f"  {error}" for error in errors))
