// Node checks: ioredis MULTI/EXEC, and BullMQ Queue and Worker.
//
// Run as `node check.mjs CHECK` by ../run.sh with COMPAT_HOST, COMPAT_PORT and
// COMPAT_PREFIX set (see ../python/common.py for the contract). Prints one
// final `PASS …` or `FAIL …` line and exits 0 or 1.

import { Queue, Worker, Job } from "bullmq";
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

const checks = {
  "ioredis-multi": ioredisMulti,
  "bullmq-queue": bullmqQueue,
  "bullmq-worker-backlog": () => bullmqWorker(false),
  "bullmq-worker-idle": () => bullmqWorker(true),
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
