// The TypeScript conformance worker: the contract of tests/conformance/README.md,
// written with runWorker of the built package (clients/typescript/dist) and nothing below it.
// CRONOQ_TS_PACKAGE names another build of the package (the suite builds a copy of its own).
import { fileURLToPath, pathToFileURL } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const built = process.env.CRONOQ_TS_PACKAGE || `${here}../../../clients/typescript/dist/index.js`;
const { Permanent, Reject, Retryable, runWorker } = await import(pathToFileURL(built).href);

function say(line) {
  process.stdout.write(`${line}\n`);
}

function sleep(seconds, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(done, seconds * 1000);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

async function stages(lease, request) {
  // What earlier attempts saved, as this lease brought it.
  const restored = Object.fromEntries(lease.checkpoints);
  const ran = [];
  for (const stage of request.stages) {
    if (stage in restored) {
      continue;
    }
    if (lease.attempt === 1 && ran.length === request.fail_after) {
      throw new Retryable(`failed after ${ran.length} stages`);
    }
    await lease.checkpoint(stage, { stage });
    ran.push(stage);
  }
  return { ran, resumed_from: lease.resumedFrom, restored };
}

async function handle(lease) {
  say(`started ${lease.taskId} ${lease.attempt}`);
  const request = lease.json();
  switch (request.do) {
    case "echo":
      return request.value;
    case "retry":
      if (lease.attempt < request.until) {
        throw new Retryable(`not yet: attempt ${lease.attempt}`, { retryAfter: request.retry_after_s });
      }
      return { attempt: lease.attempt };
    case "throw":
      throw new Error(request.message);
    case "permanent":
      throw new Permanent(request.message);
    case "sleep":
      if (request.until !== undefined && lease.attempt >= request.until) {
        return "slept";
      }
      await sleep(request.seconds, lease.signal);
      if (lease.signal.aborted) {
        // The server gave the attempt up: stop at once.
        say(`aborted ${lease.taskId} ${lease.attempt} ${lease.abortReason}`);
        throw lease.signal.reason;
      }
      return "slept";
    case "reject":
      throw new Reject(request.message);
    case "stages":
      return stages(lease, request);
    default:
      throw new Permanent(`unknown do: ${request.do}`);
  }
}

const draining = new AbortController();
process.on("SIGTERM", () => draining.abort());
const env = process.env;
await runWorker({
  target: env.CRONOQ_TARGET,
  pool: env.CRONOQ_POOL,
  slots: Number(env.CRONOQ_SLOTS),
  token: env.CRONOQ_TOKEN,
  name: env.CRONOQ_WORKER_NAME,
  drainTimeout: Number(env.CRONOQ_DRAIN_TIMEOUT_S),
  signal: draining.signal,
  initialBackoff: 0.05,
  maxBackoff: 0.5,
  onConnect: (() => {
    let first = true;
    return () => {
      if (first) {
        first = false;
        say("ready");
      }
    };
  })(),
}, handle);
