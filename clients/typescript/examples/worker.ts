import { pathToFileURL } from "node:url";
import { Permanent, Retryable, runWorker } from "@cronoq/client";
import type { Lease } from "@cronoq/client";

// What each task does: its payload is {n, flaky?}; the return value is its output.
export async function double(lease: Lease): Promise<{ doubled: number; attempt: number }> {
  const { n, flaky } = lease.json<{ n?: unknown; flaky?: boolean }>();
  if (typeof n !== "number") {
    throw new Permanent("the payload has no number n");     // fails the task: no retry
  }
  if (flaky && lease.attempt === 1) {
    throw new Retryable("try again", { retryAfter: 0.05 }); // a retry, 50 ms later at the earliest
  }
  return { doubled: n * 2, attempt: lease.attempt };
}

// Serve pool "default" with 4 slots until `signal` aborts, then drain.
export function serve(target: string, token: string | undefined, signal: AbortSignal): Promise<void> {
  return runWorker({ target, pool: "default", token, slots: 4, signal, drainTimeout: 30 }, double);
}

// As a program: node worker.js HOST:PORT (a worker token in $CRONOQ_TOKEN);
// SIGTERM or SIGINT drains it.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const stop = new AbortController();
  process.once("SIGTERM", () => stop.abort());
  process.once("SIGINT", () => stop.abort());
  await serve(process.argv[2] ?? "127.0.0.1:7070", process.env["CRONOQ_TOKEN"], stop.signal);
}
