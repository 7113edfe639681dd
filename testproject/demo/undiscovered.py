"""A module no worker discovers (not an app's tasks.py or jobs.py): tests push payloads naming it.

Importing it sets the Redis key "imported:undiscovered", so a test can tell it never was.
"""

from django_cogworker.push.runtime import get_redis

get_redis().set("imported:undiscovered", 1)


def sneaky():
    get_redis().set("ran:undiscovered", 1)
