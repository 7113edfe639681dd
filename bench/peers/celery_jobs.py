"""celery: two tasks, Redis broker, no result backend; the worker is
`celery -A peers.celery_jobs worker -P threads -c 8`."""

import os

from celery import Celery

from . import common

app = Celery("bench", broker=os.environ["BENCH_REDIS_URL"])
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True, worker_hijack_root_logger=True)


@app.task(name="bench.noop")
def noop(t=0.0):
    common.noop(t)


@app.task(name="bench.stamp")
def stamp(t=0.0):
    common.stamp(t)
