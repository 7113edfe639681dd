"""The setup both admin benchmarks share: a private redis-server and a logged-in admin client."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def admin_client() -> Iterator[tuple[Any, Any, Any]]:
    """Yield (Django test client logged in as a superuser, a bytes Redis client, Keys), with Django
    set up against a private redis-server (the suite's helper) and an in-memory database."""
    from helpers import RedisServer

    with RedisServer() as server:
        os.environ.update(COGWORKER_REDIS_URL=server.url, DJANGO_SETTINGS_MODULE="testproject.settings",
                          DATABASE_URL="sqlite://:memory:")
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client
        from django.test.utils import setup_test_environment

        from django_cogworker.broker.keys import Keys

        setup_test_environment()
        call_command("migrate", verbosity=0)
        client = Client()
        client.force_login(User.objects.create_superuser("bench", password="bench"))
        redis = server.client()
        try:
            yield client, redis, Keys()
        finally:
            redis.close()
