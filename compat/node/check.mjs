// Node checks: ioredis MULTI/EXEC, and BullMQ Queue, Worker and QueueEvents.
//
// Run as `node check.mjs CHECK` by ../run.sh with COMPAT_HOST, COMPAT_PORT and
// COMPAT_PREFIX set (see ../python/common.py for the contract). Prints one
// final `PASS …` or `FAIL …` line and exits 0 or 1.

import { Queue, QueueEvents, Worker, Job } from "bullmq";
import Redis from "ioredis";

const host = process.env.COMPAT_HOST ?? "127.0.0.1";
const port = Number(process.env.COMPAT_PORT ?? 6379);
const prefix = process.env.COMPAT_PREFIX ?? "compat";
const connection = { host, port, connectTimeout: 5000, maxRetriesPerRequest: null };

function expect(actual, wanted, what) {
  const a = JSON.stringify(actual);
  const w = JSON.stringify(wanted);
  if (a !== w) throw new Error(`${what}: got ${a}, wanted ${w}`);
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not happen within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function ioredisMulti() {
  const r = new Redis({ host, port, connectTimeout: 5000, maxRetriesPerRequest: 1 });
  try {
    const k = `${prefix}:counter`;
    expect(await r.multi().set(k, "1").incr(k).get(k).exec(), [[null, "OK"], [null, 2], [null, "2"]],
      "multi().set().incr().get().exec()");
    // WATCH conflict: a second connection writes the key between WATCH and EXEC.
    const other = new Redis({ host, port, connectTimeout: 5000, maxRetriesPerRequest: 1 });
    try {
      await r.watch(k);
      await other.set(k, "changed");
      expect(await r.multi().set(k, "from-tx").exec(), null, "EXEC after a conflicting write (aborted)");
      expect(await r.get(k), "changed", "value after aborted EXEC");
    } finally {
      other.disconnect();
    }
    return "multi().set().incr().get().exec() -> [OK, 2, '2']; WATCH conflict -> EXEC nil";
  } finally {
    r.disconnect();
  }
}

async function bullmqQueue() {
  const queue = new Queue(`${prefix}-bull`, { connection });
  try {
    const job = await queue.add("add", { a: 2, b: 3 }, { removeOnComplete: false });
    expect(await queue.getJobCounts("waiting", "active", "completed"), { waiting: 1, active: 0, completed: 0 },
      "job counts after add");
    const back = await Job.fromId(queue, job.id);
    expect([back.name, back.data], ["add", { a: 2, b: 3 }], "job read back");
    await queue.add("later", { x: 1 }, { delay: 60000 });
    expect(await queue.getDelayedCount(), 1, "delayed count");
    return "Queue.add (plain and delayed), getJobCounts, Job.fromId";
  } finally {
    await queue.close();
  }
}

// The worker either finds a backlog (the job was added before it started:
// fetched with a Lua script, no blocking command needed) or sits idle first
// and must be woken (BullMQ waits with BZPOPMIN on the queue's marker key).
async function bullmqWorker(idleFirst) {
  const name = `${prefix}-bullw`;
  const queue = new Queue(name, { connection });
  let worker;
  try {
    const errors = [];
    let job;
    if (!idleFirst) job = await queue.add("add", { a: 2, b: 3 });
    const done = new Promise((resolve, reject) => {
      worker = new Worker(name, async (j) => j.data.a + j.data.b, { connection, drainDelay: 1 });
      worker.on("completed", (j, result) => resolve([j.id, result]));
      worker.on("failed", (j, err) => reject(new Error(`job failed: ${err.message}`)));
      worker.on("error", (err) => errors.push(err.message));
    });
    if (idleFirst) {
      await worker.waitUntilReady();
      await new Promise((r) => setTimeout(r, 2000));
      job = await queue.add("add", { a: 2, b: 3 });
    }
    let result;
    try {
      result = await withTimeout(done, 15000, "job completion");
    } catch (e) {
      if (errors.length) throw new Error(`${e.message}; worker errors: ${[...new Set(errors)].join(" | ")}`);
      throw e;
    }
    expect(result, [job.id, 5], "completed job and result");
    const back = await Job.fromId(queue, job.id);
    expect([await back.getState(), back.returnvalue], ["completed", 5], "state and returnvalue");
    const summary = idleFirst
      ? "Worker idle 2 s, then Queue.add -> processed -> completed, returnvalue 5"
      : "Queue.add, then Worker started -> processed the backlog -> completed, returnvalue 5";
    // Errors the worker emitted along the way (it retries them) do not fail
    // the check, but are named.
    await new Promise((r) => setTimeout(r, 500));
    return errors.length ? `${summary} [note: worker 'error' events: ${[...new Set(errors)].join(" | ")}]` : summary;
  } finally {
    if (worker) await withTimeout(worker.close(true), 10000, "worker.close").catch(() => {});
    await queue.close();
  }
}

// QueueEvents reads the queue's events stream with XREAD BLOCK (from `$`, so
// only events written after it started). It sits blocked through one whole
// BLOCK timeout first (blockingTimeout 2 s, idle 3 s): the read must come back
// empty on time and be re-issued. BullMQ abandons a read that has not come back
// 1 s after its BLOCK and reconnects; such a reconnect fails the check.
async function bullmqQueueEvents() {
  const name = `${prefix}-bulle`;
  const queue = new Queue(name, { connection });
  const queueEvents = new QueueEvents(name, { connection, blockingTimeout: 2000 });
  let worker;
  try {
    const errors = [];
    const reconnects = [];
    const seen = []; // [event, jobId, detail]
    queueEvents.on("error", (err) => errors.push(`QueueEvents: ${err.message}`));
    for (const event of ["waiting", "active", "completed", "failed"]) {
      queueEvents.on(event, (args) => {
        const detail = event === "completed" ? args.returnvalue : event === "failed" ? args.failedReason : args.prev;
        seen.push([event, args.jobId, detail ?? null]);
      });
    }
    queueEvents.on("ioredis:close", () => reconnects.push(Date.now()));
    await withTimeout(Promise.all([queue.waitUntilReady(), queueEvents.waitUntilReady()]), 10000,
      "Queue and QueueEvents connections ready");
    await new Promise((r) => setTimeout(r, 3000));
    const added = [
      await queue.add("add", { a: 2, b: 3 }),
      await queue.add("add", { a: 10, b: 20 }),
      await queue.add("add", { a: 1, b: -1, fail: true }),
    ];
    const ids = added.map((j) => j.id);
    worker = new Worker(name, async (j) => {
      if (j.data.fail) throw new Error("refused on purpose");
      return j.data.a + j.data.b;
    }, { connection, drainDelay: 1 });
    worker.on("error", (err) => errors.push(`Worker: ${err.message}`));
    // Job.waitUntilFinished listens to QueueEvents `completed:<id>` / `failed:<id>`.
    const finished = await withTimeout(Promise.allSettled(added.map((j) => j.waitUntilFinished(queueEvents, 14000))),
      15000, "waitUntilFinished of 3 jobs");
    expect(finished.map((f) => f.status === "fulfilled" ? f.value : `rejected: ${f.reason.message}`),
      [5, 30, "rejected: refused on purpose"], "waitUntilFinished results");
    // Every job's events, each once and in order, as the stream carried them.
    await withTimeout((async () => {
      for (;;) {
        if (ids.every((id) => seen.some(([e, j]) => j === id && (e === "completed" || e === "failed")))) return;
        await new Promise((r) => setTimeout(r, 50));
      }
    })(), 5000, "final events of all 3 jobs");
    if (reconnects.length) throw new Error(`QueueEvents' XREAD BLOCK connection was closed ${reconnects.length} time(s) during the check (e.g. a read not answered within BLOCK + 1 s)`);
    const perJob = ids.map((id) => seen.filter(([, j]) => j === id).map(([e, , d]) => `${e}:${d}`));
    expect(perJob, [
      ["waiting:null", "active:waiting", "completed:5"],
      ["waiting:null", "active:waiting", "completed:30"],
      ["waiting:null", "active:waiting", "failed:refused on purpose"],
    ], "QueueEvents per job (event:prev|returnvalue|failedReason)");
    const summary = "QueueEvents (XREAD BLOCK 2000, idle 3 s first) saw waiting -> active -> completed(5, 30) / failed for 3 jobs; waitUntilFinished resolved 5, 30 and rejected the failure";
    return errors.length ? `${summary} [note: 'error' events: ${[...new Set(errors)].join(" | ")}]` : summary;
  } finally {
    if (worker) await withTimeout(worker.close(true), 10000, "worker.close").catch(() => {});
    await withTimeout(queueEvents.close(), 10000, "queueEvents.close").catch(() => {});
    await withTimeout(queue.close(), 10000, "queue.close").catch(() => {});
  }
}

const checks = {
  "ioredis-multi": ioredisMulti,
  "bullmq-queue": bullmqQueue,
  "bullmq-worker-backlog": () => bullmqWorker(false),
  "bullmq-worker-idle": () => bullmqWorker(true),
  "bullmq-queue-events": bullmqQueueEvents,
};
const name = process.argv[2];
if (!checks[name]) {
  console.log(`FAIL unknown check ${name}; known: ${Object.keys(checks).join(", ")}`);
  process.exit(2);
}
try {
  const summary = await checks[name]();
  console.log(`PASS ${summary}`);
  process.exit(0);
} catch (e) {
  console.error(e);
  console.log(`FAIL ${String(e.message ?? e).replace(/\s+/g, " ").slice(0, 400)}`);
  process.exit(1);
}
