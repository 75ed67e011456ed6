"""arq: create_pool + enqueue_job, a burst Worker, and the job result."""

import asyncio

from arq import create_pool
from arq.connections import RedisSettings
from arq.jobs import JobStatus
from arq.worker import Worker

from common import HOST, PORT, PREFIX, expect, main


async def add(ctx, a, b):
    return a + b


async def run():
    settings = RedisSettings(host=HOST, port=PORT, conn_timeout=5, conn_retries=1)
    queue = f"{PREFIX}:arq:queue"
    pool = await create_pool(settings, default_queue_name=queue)
    try:
        job = await pool.enqueue_job("add", 2, 3)
        expect(job is None, False, "enqueue_job returned a job")
        expect(await job.status(), JobStatus.queued, "status after enqueue")
        dup = await pool.enqueue_job("add", 1, 1, _job_id=job.job_id)
        expect(dup, None, "enqueue with a duplicate job id (WATCH/MULTI) refused")
        worker = Worker(
            functions=[add], redis_pool=pool, queue_name=queue, burst=True,
            poll_delay=0.1, handle_signals=False, max_jobs=2,
        )
        await worker.main()
        expect((worker.jobs_complete, worker.jobs_failed), (1, 0), "jobs complete/failed")
        expect(await job.result(timeout=10), 5, "job.result()")
        expect(await job.status(), JobStatus.complete, "status after work")
        await worker.close()
    finally:
        await pool.aclose()
    return "enqueue_job add(2, 3) -> burst Worker -> complete, result 5; duplicate job id refused"


async def run_idle():
    """A long-running (not burst) worker, idle before the job arrives: arq polls."""
    settings = RedisSettings(host=HOST, port=PORT, conn_timeout=5, conn_retries=1)
    queue = f"{PREFIX}:arq:queue"
    pool = await create_pool(settings, default_queue_name=queue)
    worker = Worker(
        functions=[add], redis_settings=settings, queue_name=queue,
        poll_delay=0.2, handle_signals=False,
    )
    task = asyncio.create_task(worker.async_run())
    try:
        await asyncio.sleep(1.5)
        if task.done():
            task.result()  # raises what stopped the worker
            raise AssertionError("worker stopped while idle")
        job = await pool.enqueue_job("add", 4, 5)
        expect(await job.result(timeout=10), 9, "job.result()")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await worker.close()
        await pool.aclose()
    return "idle Worker (not burst) picked up add(4, 5), result 9"


def check():
    return asyncio.run(run())


def check_idle():
    return asyncio.run(run_idle())


if __name__ == "__main__":
    main({"job": check, "worker-idle": check_idle})
