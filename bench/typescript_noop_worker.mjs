// A TypeScript (Node) worker with a no-op handler, for bench/typescript_worker.py:
// node bench/typescript_noop_worker.mjs HOST:PORT SLOTS. SIGTERM drains it.
import { runWorker } from "../clients/typescript/dist/index.js";

const [target, slots] = process.argv.slice(2);
const stop = new AbortController();
process.once("SIGTERM", () => stop.abort());
process.once("SIGINT", () => stop.abort());
await runWorker({ target, pool: "default", slots: Number(slots), name: "typescript-bench", signal: stop.signal,
  drainTimeout: 5 }, () => null);
