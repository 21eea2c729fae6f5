// One BullMQ worker process on queue `bench`: concurrency 50, a no-op processor, every
// other setting BullMQ's default. It times itself (so the measure costs the hot path one
// counter and one clock read per job, no Redis call): the first and last completion
// (wall clock, sub-millisecond) and its CPU from the first completion on. On SIGTERM it
// prints one JSON line with them and exits.
// Usage: node worker.cjs PORT   (NODE_PATH names the node_modules with bullmq)
"use strict";
const { Worker } = require("bullmq");

const CONCURRENCY = 50;
const now = () => performance.timeOrigin + performance.now();

const port = Number(process.argv[2]);
let completed = 0;
let first = null;
let last = null;
let cpuFirst = null;

const worker = new Worker("bench", async () => {}, {
  connection: { host: "127.0.0.1", port },
  concurrency: CONCURRENCY,
});
worker.on("completed", () => {
  last = now();
  if (completed++ === 0) {
    first = last;
    cpuFirst = process.cpuUsage();
  }
});
worker.on("error", (err) => console.error(`bench-bullmq worker ${process.pid}: ${err}`));

process.on("SIGTERM", () => {
  const cpu = process.cpuUsage(cpuFirst || undefined);
  const cpuUs = cpuFirst ? cpu.user + cpu.system : 0;
  process.stdout.write(JSON.stringify({ pid: process.pid, completed, first_ms: first, last_ms: last, cpu_us: cpuUs }) + "\n");
  worker.close().finally(() => process.exit(0));
  setTimeout(() => process.exit(0), 5000).unref();
});
