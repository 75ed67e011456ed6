"""The Celery app of the celery check: Redis broker and Redis result backend.

Configured from the environment (run by celery_check.py and by the worker it
starts): COMPAT_CELERY_BROKER, COMPAT_CELERY_BACKEND (empty: no backend),
COMPAT_CELERY_QUEUE.
"""

import os

from celery import Celery

app = Celery(
    "compat",
    broker=os.environ["COMPAT_CELERY_BROKER"],
    backend=os.environ.get("COMPAT_CELERY_BACKEND") or None,
)
app.conf.task_default_queue = os.environ["COMPAT_CELERY_QUEUE"]
app.conf.broker_connection_retry_on_startup = True
app.conf.broker_connection_timeout = 5
app.conf.redis_socket_timeout = 10
app.conf.result_expires = 300


@app.task
def add(a, b):
    return a + b


@app.task
def mark(key, value):
    """Leave a trace the check can read without a result backend."""
    import redis

    redis.Redis.from_url(os.environ["COMPAT_CELERY_BROKER"], socket_timeout=10).set(key, value)
    return value


@app.task
def slow_add(a, b, delay):
    """Finishes after `delay` s: the client is already waiting on pub/sub."""
    import time

    time.sleep(delay)
    return a + b


@app.task
def fail(message):
    raise ValueError(message)


@app.task
def nap(seconds):
    """Keeps the worker busy so control commands see it as active."""
    import time

    time.sleep(seconds)
    return seconds
