"""RQ: enqueue, a burst Worker, results, status, depends_on, and `rq worker`.

A burst worker dequeues with LPOP (no blocking command); the long-running
`rq worker` waits for work with BLMOVE/BLPOP, which is what `cli_worker`
checks: the worker is started and idle before the job is enqueued.
"""

import sys
import time

import redis
from rq import Queue, Worker

import compat_tasks
from common import PREFIX, URL, CheckFailed, expect, main
from common import Worker as WorkerProcess


def queue():
    r = redis.Redis.from_url(URL, socket_timeout=10, socket_connect_timeout=5)
    return r, Queue(f"{PREFIX}-q", connection=r)


def basic():
    r, q = queue()
    job = q.enqueue(compat_tasks.add, 2, 3)
    expect(job.get_status(), "queued", "status after enqueue")
    expect(len(q), 1, "queue length")
    worked = Worker([q], connection=r, name=f"{PREFIX}-w").work(burst=True)
    expect(worked, True, "work(burst=True) did work")
    job.refresh()
    expect(job.get_status(), "finished", "status after burst worker")
    expect(job.return_value(), 5, "return_value()")
    expect(len(q), 0, "queue length after work")
    return "enqueue add(2, 3) -> burst Worker -> finished, return_value() == 5"


def depends():
    r, q = queue()
    first = q.enqueue(compat_tasks.add, 1, 2)
    second = q.enqueue(compat_tasks.concat, "after", "first", depends_on=first)
    expect(second.get_status(), "deferred", "dependent job status before work")
    Worker([q], connection=r, name=f"{PREFIX}-w").work(burst=True)
    first.refresh()
    second.refresh()
    expect((first.get_status(), second.get_status()), ("finished", "finished"), "statuses after work")
    expect((first.return_value(), second.return_value()), (3, "after-first"), "results")
    return "depends_on: deferred until parent finished, both finished with results"


def cli_worker():
    r, q = queue()
    proc = WorkerProcess([sys.executable, "-m", "rq.cli", "worker", "--url", URL, "--name", f"{PREFIX}-cli", q.name])
    try:
        time.sleep(2)  # let it register and start waiting
        if proc.exited():
            raise CheckFailed(f"while idle, the rq {proc.exited()}")
        job = q.enqueue(compat_tasks.add, 2, 3)
        started = time.monotonic()
        while job.get_status(refresh=True) != "finished":
            if proc.exited():
                raise CheckFailed(f"job {job.get_status()}; the rq {proc.exited()}")
            if time.monotonic() - started > 20:
                raise CheckFailed(f"job still {job.get_status()} after 20 s")
            time.sleep(0.2)
        expect(job.return_value(), 5, "return_value()")
        return f"idle `rq worker` picked up add(2, 3) after {time.monotonic() - started:.1f}s, result 5"
    finally:
        proc.stop()


if __name__ == "__main__":
    main({"basic": basic, "depends": depends, "cli-worker": cli_worker})
