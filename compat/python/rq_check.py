"""RQ: enqueue, a burst Worker, results, status, and depends_on."""

import redis
from rq import Queue, Worker

import compat_tasks
from common import PREFIX, URL, expect, main


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


if __name__ == "__main__":
    main({"basic": basic, "depends": depends})
