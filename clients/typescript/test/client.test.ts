// The Client against a real cronoq-server.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { StatusEvent } from "@cronoq/client";
import { clientFor, config, deferred, serverFor, until, workerFor } from "./serverkit.js";

test("submit, get, wait, list and submitBatch with task options", async (t) => {
  const server = await serverFor(t, config(["default", "batch"]));
  const client = clientFor(t, server);
  const sub = await client.submit({ n: 1 }, { pool: "batch", key: "report-7", priority: "high", kind: "report",
    tags: { team: "ml" }, labels: { gpu: "a100" }, tenant: "acme", deadlineIn: 60, stages: ["fetch", "render"],
    retry: { maxAttempts: 5 } });
  assert.equal(sub.duplicate, false);
  assert.equal(sub.result, null);
  assert.match(sub.id, /^[0-9]+$/);
  const again = await client.submit({ n: 2 }, { pool: "batch", key: "report-7" });
  assert.deepEqual([again.duplicate, again.id], [true, sub.id]);
  const info = await client.get(sub.id);
  assert.equal(info.status, "ready");
  assert.equal(info.pool, "batch");
  assert.equal(info.key, "report-7");
  assert.equal(info.kind, "report");
  assert.equal(info.priority, "high");
  assert.equal(info.tenant, "acme");
  assert.equal(info.maxAttempts, 5);
  assert.deepEqual(info.tags, { team: "ml" });
  assert.deepEqual(info.labels, { gpu: "a100" });
  assert.deepEqual(info.stages, ["fetch", "render"]);
  assert.ok(info.created instanceof Date);
  assert.equal((await client.get({ key: "report-7" })).id, sub.id);
  const batch = await client.submitBatch([
    { payload: "first", key: "b1" },
    { payload: "second", after: { key: "b1" } },
  ]);
  assert.equal(batch.length, 2);
  assert.equal((await client.get(batch[1]!.id)).status, "blocked");
  assert.deepEqual((await client.get(batch[1]!.id)).deps, [{ ref: { key: "b1" }, on: "success" }]);
  const page = await client.list({ pools: ["default"], limit: 1 });
  assert.deepEqual(page.tasks.map((task) => task.id), [batch[0]!.id]);
  assert.equal(page.nextAfter, batch[0]!.id);
  const rest = await client.list({ pools: ["default"], after: page.nextAfter! });
  assert.deepEqual(rest.tasks.map((task) => task.id), [batch[1]!.id]);
  assert.equal(rest.nextAfter, null);
  const ready = await client.list({ statuses: ["ready"] });
  assert.deepEqual(ready.tasks.map((task) => task.id).sort(), [sub.id, batch[0]!.id].sort());
  await assert.rejects(client.wait(sub.id, { timeout: 0.1 }),
    (error: Error & { code?: string }) => error.code === "DEADLINE_EXCEEDED");
  await assert.rejects(client.get("123456789012345678"),
    (error: Error & { code?: string; kind?: string }) => error.code === "NOT_FOUND" && error.kind === "UnknownTask");
  await assert.rejects(client.list({ statuses: ["bogus" as "ready"] }), RangeError);
  // A batch is all or none: the bad dependency refuses both tasks.
  await assert.rejects(client.submitBatch([{ payload: 1 }, { payload: 2, after: "999999999" }]),
    (error: Error & { kind?: string }) => error.kind === "UnknownDependency");
});

test("cancel and watch: the stream sees every transition as it happens", async (t) => {
  const server = await serverFor(t);
  const client = clientFor(t, server);
  const stop = new AbortController();
  const events: StatusEvent[] = [];
  const watching = (async () => {
    // recent: what happened before the stream opened comes first, so nothing is missed.
    for await (const event of client.watch({ signal: stop.signal, recent: 100 })) {
      events.push(event);
    }
  })();
  const marker = await client.submit({}, { kind: "marker" });
  await until(() => events.some((e) => e.id === marker.id), "the watch shows the marker task");
  const started = deferred();
  const worker = workerFor(t, server, async (lease) => {
    if (lease.kind === "hold") {
      started.resolve();
      await new Promise((resolve) => lease.signal.addEventListener("abort", resolve, { once: true }));
    }
    return "done";
  });
  await worker.connected;
  const held = await client.submit({}, { kind: "hold" });
  await started.promise;
  assert.equal(await client.cancel(held.id), true);
  assert.equal((await client.wait(held.id)).status, "cancelled");
  const quick = await client.submit({}, { wait: true });
  assert.equal(quick.result!.text(), "done");
  await until(() => events.some((e) => e.id === quick.id && e.status === "succeeded"), "watch saw it succeed");
  const ofHeld = events.filter((e) => e.id === held.id).map((e) => e.status);
  assert.deepEqual(ofHeld.slice(-2), ["running", "cancelled"]);
  assert.ok(ofHeld.includes("ready"));
  stop.abort();
  await watching;   // ends quietly once its signal aborted
  const terminal: StatusEvent[] = [];
  for await (const event of client.watch({ terminalOnly: true, recent: 10 })) {
    terminal.push(event);
    if (terminal.length === 3) break;
  }
  // One slot: the marker ran first, then the held task, then the quick one.
  assert.deepEqual(terminal.map((e) => [e.id, e.status]),
    [[marker.id, "succeeded"], [held.id, "cancelled"], [quick.id, "succeeded"]]);
  assert.ok(terminal[2]!.at instanceof Date);
});

test("ids are strings or BigInt, never Numbers", async (t) => {
  const server = await serverFor(t);
  const client = clientFor(t, server);
  const sub = await client.submit("x");
  assert.equal((await client.get(BigInt(sub.id))).id, sub.id);
  await assert.rejects(client.get(Number(sub.id) as unknown as string), /never a Number/);
  await assert.rejects(client.get("job-1" as string), /decimal string or a BigInt/);
  await assert.rejects(client.get(2n ** 64n), RangeError);
});
