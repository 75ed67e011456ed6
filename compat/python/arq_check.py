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


def check():
    return asyncio.run(run())


if __name__ == "__main__":
    main({"job": check})
