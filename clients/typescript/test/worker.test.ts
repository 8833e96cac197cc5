// runWorker against real cronoq-server processes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Cancelled, Permanent, Reject, Retryable } from "@cronoq/client";
import type { Lease } from "@cronoq/client";
import { AUTH, METRICS, ServerProcess, clientFor, config, deferred, later, listen, serverFor, until,
  workerFor } from "./serverkit.js";

function released(lease: Lease): Promise<void> {
  return new Promise((resolve) => {
    if (lease.signal.aborted) {
      resolve();
    } else {
      lease.signal.addEventListener("abort", () => resolve(), { once: true });
    }
  });
}

test("the handler's return value is the task's output: JSON, text or bytes", async (t) => {
  const server = await serverFor(t);
  const seen: Lease[] = [];
  const worker = workerFor(t, server, (lease) => {
    seen.push(lease);
    const kind = lease.kind;
    if (kind === "text") return lease.text().toUpperCase();
    if (kind === "bytes") return Buffer.from([1, 2, 3]);
    return { doubled: lease.json<{ n: number }>().n * 2, attempt: lease.attempt };
  });
  await worker.connected;
  const client = clientFor(t, server);
  const json = await client.submit({ n: 21 }, { wait: true, tags: { team: "a" }, key: "job-21" });
  assert.equal(json.result!.status, "succeeded");
  assert.equal(json.result!.contentType, "application/json");
  assert.deepEqual(json.result!.json(), { doubled: 42, attempt: 1 });
  const text = await client.submit("scanned page", { kind: "text", wait: true });
  assert.equal(text.result!.text(), "SCANNED PAGE");
  assert.equal(text.result!.contentType, "text/plain; charset=utf-8");
  const bytes = await client.submit(Buffer.from("x"), { kind: "bytes", wait: true });
  assert.deepEqual([...bytes.result!.output!], [1, 2, 3]);
  assert.equal(bytes.result!.contentType, "application/octet-stream");
  const first = seen[0]!;
  assert.equal(first.taskId, json.id);
  assert.equal(typeof first.id, "string");
  assert.equal(first.key, "job-21");
  assert.deepEqual(first.tags, { team: "a" });
  assert.equal(first.contentType, "application/json");
  assert.equal(first.pool, "default");
  assert.equal(first.leaseTtl, 2);
});

test("Retryable with retryAfter: the next attempt waits at least that long", async (t) => {
  const server = await serverFor(t);
  const starts: number[] = [];
  const worker = workerFor(t, server, (lease) => {
    starts.push(Date.now());
    if (lease.attempt === 1) {
      throw new Retryable("the index is busy", { retryAfter: 0.6 });
    }
    return { attempt: lease.attempt };
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({}, { wait: true });
  assert.deepEqual(sub.result!.json(), { attempt: 2 });
  // The pool's own backoff is 10 ms: only retry_after_s explains the gap.
  assert.ok(starts[1]! - starts[0]! >= 550, `the retry came after ${starts[1]! - starts[0]!} ms`);
  const info = await client.get(sub.id);
  assert.equal(info.attempts[0]!.status, "retrying");
  assert.equal(info.attempts[0]!.message, "the index is busy");
  assert.equal(info.attempts[1]!.status, "succeeded");
});

test("a thrown error is a retryable failure whose message is its stack", async (t) => {
  const server = await serverFor(t);
  const attempts: number[] = [];
  const worker = workerFor(t, server, function handle(lease) {
    attempts.push(lease.attempt);
    throw new TypeError("the model returned nothing");
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({}, { retry: { maxAttempts: 2, initialBackoff: 0.01 } });
  const result = await client.wait(sub.id, { timeout: 20 });
  assert.equal(result.status, "dead_lettered");   // retryable failures, every attempt used
  assert.deepEqual(attempts, [1, 2]);
  assert.match(result.message!, /^gave up after 2 attempts: TypeError: the model returned nothing\n\s+at handle /);
  const info = await client.get(sub.id);
  assert.equal(info.attempts[0]!.status, "retrying");
  assert.match(info.attempts[0]!.message!, /^TypeError: the model returned nothing\n\s+at handle .*worker\.test\.js/);
});

test("Permanent fails the task at once; Cancelled ends it as cancelled", async (t) => {
  const server = await serverFor(t);
  const attempts: string[] = [];
  const worker = workerFor(t, server, (lease) => {
    attempts.push(`${lease.kind} ${lease.attempt}`);
    if (lease.kind === "permanent") throw new Permanent("the input is not a PDF");
    throw new Cancelled("nobody wants it any more");
  });
  await worker.connected;
  const client = clientFor(t, server);
  const permanent = await client.submit({}, { kind: "permanent", wait: true });
  assert.equal(permanent.result!.status, "failed");
  assert.equal(permanent.result!.message, "the input is not a PDF");
  const cancelled = await client.submit({}, { kind: "cancel", wait: true });
  assert.equal(cancelled.result!.status, "cancelled");
  assert.deepEqual(attempts, ["permanent 1", "cancel 1"]);
});

test("Reject gives the lease to another worker without using an attempt", async (t) => {
  const server = await serverFor(t);
  const bConnected = deferred();
  const rejected: string[] = [];
  const a = workerFor(t, server, async (lease) => {
    await bConnected.promise;
    rejected.push(lease.taskId);
    throw new Reject("no GPU here");
  }, { name: "a" });
  await a.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({ n: 1 });
  await until(async () => (await client.get(sub.id)).status === "running", "worker a holds the task");
  const b = workerFor(t, server, (lease) => ({ by: "b", attempt: lease.attempt }), { name: "b" });
  await b.connected;
  bConnected.resolve();
  const result = await client.wait(sub.id, { timeout: 20 });
  assert.deepEqual(result.json(), { by: "b", attempt: 1 });
  assert.deepEqual(rejected, [sub.id]);
});

test("a cancelled task aborts lease.signal with reason cancelled", async (t) => {
  const server = await serverFor(t);
  const started = deferred<Lease>();
  const aborted = deferred<string | null>();
  const worker = workerFor(t, server, async (lease) => {
    started.resolve(lease);
    await released(lease);
    aborted.resolve(lease.abortReason);
    throw lease.signal.reason;
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({});
  const lease = await started.promise;
  assert.equal(lease.signal.aborted, false);
  assert.equal(await client.cancel(sub.id), true);
  assert.equal(await aborted.promise, "cancelled");
  assert.equal((await client.wait(sub.id)).status, "cancelled");
  assert.equal(await client.cancel(sub.id), false);
});

test("an attempt past its timeout is aborted with reason timeout", async (t) => {
  const server = await serverFor(t);
  const reasons: (string | null)[] = [];
  const worker = workerFor(t, server, async (lease) => {
    assert.equal(lease.timeout, 0.3);
    await released(lease);
    reasons.push(lease.abortReason);
    return "too late";
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({}, { timeout: 0.3, retry: { maxAttempts: 1 } });
  const result = await client.wait(sub.id, { timeout: 20 });
  assert.equal(result.status, "dead_lettered");
  assert.equal(result.output, null);
  assert.deepEqual(reasons, ["timeout"]);
});

test("heartbeats keep a lease alive past its TTL", async (t) => {
  const server = await serverFor(t, config(["default"]).replace("lease_ttl_s = 2", "lease_ttl_s = 1"));
  const worker = workerFor(t, server, async (lease) => {
    await new Promise((resolve) => setTimeout(resolve, 3000));   // three lease TTLs
    return { aborted: lease.signal.aborted, ttl: lease.leaseTtl };
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({}, { retry: { maxAttempts: 1 }, wait: true });
  assert.equal(sub.result!.status, "succeeded", sub.result!.message ?? "");
  assert.deepEqual(sub.result!.json(), { aborted: false, ttl: 1 });
});

test("the worker never runs more leases than the server granted", async (t) => {
  const server = await serverFor(t, config(["default"]).replace("lease_ttl_s = 2", "lease_ttl_s = 2\nmax = 2"));
  let running = 0;
  let most = 0;
  const worker = workerFor(t, server, async () => {
    running += 1;
    most = Math.max(most, running);
    await new Promise((resolve) => setTimeout(resolve, 40));
    running -= 1;
    return null;
  }, { slots: 4 });
  const info = await worker.connected;
  assert.equal(info.slots, 2);   // the pool's max leaves 2 of the 4 asked for
  const client = clientFor(t, server);
  const subs = await client.submitBatch(Array.from({ length: 12 }, (_, n) => ({ payload: { n } })));
  for (const sub of subs) {
    assert.equal((await client.wait(sub.id, { timeout: 20 })).status, "succeeded");
  }
  assert.equal(most, 2);
});

test("an aborted handler that has not returned keeps its slot", async (t) => {
  const server = await serverFor(t);
  const stuck = deferred();
  const started: string[] = [];
  const firstStarted = deferred();
  const worker = workerFor(t, server, async (lease) => {
    started.push(lease.kind);
    if (lease.kind === "stubborn") {
      firstStarted.resolve();
      await stuck.promise;   // ignores lease.signal
    }
    return lease.kind;
  }, { slots: 1 });
  await worker.connected;
  const client = clientFor(t, server);
  const stubborn = await client.submit({}, { kind: "stubborn" });
  await firstStarted.promise;
  await client.cancel(stubborn.id);
  const next = await client.submit({}, { kind: "next" });
  // The server freed the slot and leased the next task; the worker holds it
  // (heartbeating it) until the stubborn handler returns.
  await until(async () => (await client.get(next.id)).status === "running", "the next task is leased");
  assert.deepEqual(started, ["stubborn"]);
  stuck.resolve();
  assert.equal((await client.wait(next.id, { timeout: 20 })).text(), "next");
  assert.deepEqual(started, ["stubborn", "next"]);
});

test("checkpointed stages: a retry resumes after the last saved stage", async (t) => {
  const server = await serverFor(t);
  const worker = workerFor(t, server, async (lease) => {
    for (const stage of lease.stages ?? []) {
      if (lease.checkpoints.has(stage)) {
        continue;
      }
      if (stage === "index" && lease.attempt === 1) {
        throw new Retryable("the index is busy");
      }
      const saved = await lease.checkpoint(stage, { stage, attempt: lease.attempt });
      assert.equal(saved.stage, stage);
    }
    return { resumedFrom: lease.resumedFrom, attempt: lease.attempt, completed: lease.completedStages,
      chunk: lease.checkpointInfo("chunk")?.data };
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({ doc: 42 }, { stages: ["chunk", "embed", "index"], wait: true });
  assert.deepEqual(sub.result!.json(), { resumedFrom: "embed", attempt: 2, completed: ["chunk", "embed", "index"],
    chunk: { stage: "chunk", attempt: 1 } });
  const info = await client.get(sub.id);
  assert.deepEqual(info.checkpoints.map((c) => [c.stage, c.attempt]), [["chunk", 1], ["embed", 1], ["index", 2]]);
  assert.deepEqual(info.checkpoints[0]!.data, { stage: "chunk", attempt: 1 });
});

test("a refused checkpoint rejects with the server's reason", async (t) => {
  const server = await serverFor(t);
  const worker = workerFor(t, server, async (lease) => {
    try {
      await lease.checkpoint("undeclared", "x");
      return "saved";
    } catch (error) {
      return `${(error as Error).name}: ${(error as Error).message}`;
    }
  });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({}, { stages: ["chunk"], wait: true });
  assert.match(sub.result!.text(), /^CheckpointError: .*undeclared/);
});

test("draining: no new leases, the running one finishes, then runWorker resolves", async (t) => {
  const server = await serverFor(t);
  const started = deferred();
  const finish = deferred();
  const worker = workerFor(t, server, async (lease) => {
    started.resolve();
    await finish.promise;
    return { aborted: lease.signal.aborted };
  }, { drainTimeout: 30 });
  await worker.connected;
  const client = clientFor(t, server);
  const metrics = clientFor(t, server, METRICS);
  const sub = await client.submit({});
  await started.promise;
  worker.controller.abort();
  // SetSlots 0: the server grants the worker no slot any more.
  await until(async () => (await metrics.workers())[0]?.slots === 0, "the worker drains");
  let resolved = false;
  void worker.done.then(() => { resolved = true; });
  const later_ = await client.submit({});
  assert.equal((await client.get(later_.id)).status, "ready");
  assert.equal(resolved, false);
  finish.resolve();
  await worker.done;
  assert.deepEqual((await client.wait(sub.id)).json(), { aborted: false });
  await until(async () => (await metrics.workers()).length === 0, "the worker disconnects");
  assert.equal((await client.get(later_.id)).status, "ready");
});

test("draining past drainTimeout aborts the handler and fails the attempt", async (t) => {
  const server = await serverFor(t);
  const started = deferred();
  const reasons: (string | null)[] = [];
  const worker = workerFor(t, server, async (lease) => {
    started.resolve();
    await released(lease);
    reasons.push(lease.abortReason);
    return "ignored";
  }, { drainTimeout: 0.2 });
  await worker.connected;
  const client = clientFor(t, server);
  const sub = await client.submit({}, { retry: { maxAttempts: 1 } });
  await started.promise;
  worker.controller.abort();
  await worker.done;
  const result = await client.wait(sub.id, { timeout: 20 });
  assert.equal(result.status, "dead_lettered");
  assert.equal(result.message, "gave up after 1 attempt: the worker stopped before the attempt finished");
  assert.deepEqual(reasons, ["shutdown"]);
});

test("the worker reconnects with backoff when its server comes back", async (t) => {
  const first = await serverFor(t);
  const port = first.grpcPort;
  const connections: string[] = [];
  const worker = workerFor(t, first.target, (lease) => ({ attempt: lease.attempt }),
    { onConnect: (info) => connections.push(info.workerId), logger: { info: () => {}, warn: () => {} } });
  await worker.connected;
  await first.stop();
  const second = new ServerProcess(listen(port) + AUTH + config().slice(listen().length + AUTH.length));
  later(t, () => second.stop());
  await second.start();
  await until(() => connections.length === 2, "the worker registers with the new server");
  const client = clientFor(t, second);
  const sub = await client.submit({}, { wait: true });
  assert.deepEqual(sub.result!.json(), { attempt: 1 });
});

test("a rejected token ends runWorker with UNAUTHENTICATED", async (t) => {
  const server = await serverFor(t);
  const worker = workerFor(t, server, () => null, { token: "not-a-token-0123456789abcdef0123456" });
  await assert.rejects(worker.done, (error: Error & { code?: string }) => error.code === "UNAUTHENTICATED");
  const unknown = workerFor(t, server, () => null, { pool: "nowhere" });
  await assert.rejects(unknown.done, (error: Error & { code?: string; kind?: string }) =>
    error.code === "NOT_FOUND" && error.kind === "UnknownPool");
});
