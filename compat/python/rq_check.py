"""RQ: enqueue, a burst Worker, results, status, depends_on, and `rq worker`.

A burst worker dequeues with LPOP (no blocking command); the long-running
`rq worker` waits for work with BLMOVE/BLPOP, which is what `cli_worker`
checks: the worker is started and idle before the job is enqueued.
`worker_commands` sends the `rq.command` commands, which a worker receives
on its own pub/sub channel `rq:pubsub:<name>` (SUBSCRIBEd from a thread).
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


def wait_for(predicate, seconds, what, proc=None):
    """Poll predicate() until true; `what` (a string, or a function giving one
    at the time of failure) names what did not happen."""
    started = time.monotonic()
    while not predicate():
        if proc is not None and proc.exited():
            raise CheckFailed(f"waiting for {what() if callable(what) else what}: the rq {proc.exited()}")
        if time.monotonic() - started > seconds:
            raise CheckFailed(f"{what() if callable(what) else what}: not within {seconds} s")
        time.sleep(0.1)
    return time.monotonic() - started


def stop_cold(proc):
    """Stop an `rq worker` that may be busy: a first SIGTERM asks for a warm
    shutdown (which would wait for the job), a second one kills the horse."""
    import signal

    for _ in range(2):
        if proc.proc.poll() is not None:
            break
        proc.proc.send_signal(signal.SIGTERM)
        try:
            proc.proc.wait(timeout=1)
        except Exception:  # noqa: BLE001 - still running: signal again
            pass
    proc.stop()


def worker_commands():
    from rq.command import send_kill_horse_command, send_shutdown_command, send_stop_job_command

    r, q = queue()
    name = f"{PREFIX}-cmd"
    channel = f"rq:pubsub:{name}"
    proc = WorkerProcess([sys.executable, "-m", "rq.cli", "worker", "--url", URL, "--name", name, q.name])
    try:
        wait_for(lambda: r.pubsub_numsub(channel)[0][1] == 1, 20, f"the worker's SUBSCRIBE to {channel}", proc)
        # 1. stop-job: the running job's horse is killed, the job is `stopped`.
        job = q.enqueue(compat_tasks.sleep_for, 20, job_timeout=60)
        wait_for(lambda: job.get_status(refresh=True) == "started", 15, "job 1 started", proc)
        send_stop_job_command(r, job.id)
        took_stop = wait_for(lambda: job.get_status(refresh=True) == "stopped", 10,
                             lambda: f"job 1 stopped after stop-job (status {job.get_status()})", proc)
        # 2. kill-horse: the next job's horse is killed, the job fails.
        job2 = q.enqueue(compat_tasks.sleep_for, 20, job_timeout=60)
        wait_for(lambda: job2.get_status(refresh=True) == "started", 15, "job 2 started", proc)
        send_kill_horse_command(r, name)
        took_kill = wait_for(lambda: job2.get_status(refresh=True) == "failed", 10,
                             lambda: f"job 2 failed after kill-horse (status {job2.get_status()})", proc)
        exc = (job2.latest_result().exc_string or "") if job2.latest_result() else ""
        if "Work-horse terminated unexpectedly" not in exc:
            raise CheckFailed(f"job 2's failure is not the killed horse: {exc[-200:]!r}")
        # 3. the worker survived both and still runs jobs.
        job3 = q.enqueue(compat_tasks.add, 2, 3)
        wait_for(lambda: job3.get_status(refresh=True) == "finished", 15, "job 3 finished", proc)
        expect(job3.return_value(), 5, "job 3 return_value()")
        # 4. shutdown: the worker exits and unregisters.
        send_shutdown_command(r, name)
        took_shutdown = wait_for(lambda: proc.proc.poll() is not None, 15, "worker exit after shutdown")
        expect(proc.proc.returncode, 0, "worker exit status after shutdown")
        expect(bool(r.sismember("rq:workers", f"rq:worker:{name}")), False, "worker still registered after shutdown")
        return (f"worker on {channel.replace(name, '<name>')}: stop-job -> job stopped in {took_stop:.1f}s, "
                f"kill-horse -> job failed in {took_kill:.1f}s, next job ran (5), "
                f"shutdown -> exit 0 in {took_shutdown:.1f}s")
    finally:
        stop_cold(proc)


if __name__ == "__main__":
    main({"basic": basic, "depends": depends, "cli-worker": cli_worker, "worker-commands": worker_commands})
