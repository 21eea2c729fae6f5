// Queues TASKS no-op jobs on BullMQ's queue `bench` with addBulk, CHUNK jobs per call.
// Payload: 16 bytes of JSON, as `gaffer bench` pushes. removeOnComplete: a completed job's
// hash is deleted in the same script that finishes it, so Redis holds only what is left
// to do and never fills, which is what a BullMQ user running no-op jobs at volume sets.
// Usage: node producer.cjs PORT TASKS   (NODE_PATH names the node_modules with bullmq)
"use strict";
const { Queue } = require("bullmq");

const CHUNK = 1000;

async function main() {
  const [port, tasks] = process.argv.slice(2).map(Number);
  const queue = new Queue("bench", { connection: { host: "127.0.0.1", port } });
  const opts = { removeOnComplete: true, removeOnFail: true };
  for (let done = 0; done < tasks; done += CHUNK) {
    const n = Math.min(CHUNK, tasks - done);
    await queue.addBulk(Array.from({ length: n }, () => ({ name: "noop", data: "xxxxxxxxxxxxxx", opts })));
  }
  await queue.close();
}

main().catch((err) => {
  console.error(`bench-bullmq producer: ${err.stack || err}`);
  process.exit(1);
});
