"""Django system checks: ``manage.py check`` reports every config problem, naming the setting."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .errors import ConfigError


@checks.register("cogworker")
def check_config(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    import os

    from django.conf import settings

    from .conf import build_config
    from .middleware import import_string

    try:
        # Built afresh (not the shared runtime config, whose Redis pool stays in use).
        config = build_config(getattr(settings, "COGWORKER", None), os.environ)
    except ConfigError as exc:
        return [checks.Error(message, id="cogworker.E001") for message in exc.errors]
    errors = []
    for setting, paths in (("CLIENT_MIDDLEWARE", config.client_middleware),
                           ("SERVER_MIDDLEWARE", config.server_middleware),
                           ("DEATH_HANDLERS", config.death_handlers)):
        for path in paths:
            try:
                import_string(path)
            except ImportError as exc:
                errors.append(checks.Error(f'COGWORKER["{setting}"] entry {path!r} cannot be imported: {exc}',
                                           id="cogworker.E002"))
    from .periodic import build_entries

    try:
        build_entries(config.periodic, settings.TIME_ZONE or "UTC")
    except ConfigError as exc:
        errors.extend(checks.Error(message, id="cogworker.E003") for message in exc.errors)
    if config.clock:
        try:
            import_string(config.clock)
        except ImportError as exc:
            errors.append(checks.Error(f'COGWORKER["CLOCK"] {config.clock!r} cannot be imported: {exc}',
                                       id="cogworker.E002"))
    return errors
