// Sharded servers: ids above 2^53 stay exact, and a worker follows its pool to its shard.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Lease } from "@cronoq/client";
import { clientFor, freePort, serverFor, shardsConfig, workerFor } from "./serverkit.js";

test("a worker sent to the wrong shard follows its pool there; ids beyond 2^53 stay exact", async (t) => {
  const ports = { a: await freePort(), b: await freePort() };
  const a = await serverFor(t, shardsConfig(ports, "a"), ["--shard", "a"]);
  const b = await serverFor(t, shardsConfig(ports, "b"), ["--shard", "b"]);
  const seen: Lease[] = [];
  const targets: string[] = [];
  // The worker is configured with shard a's server; pool gpu is shard b's.
  const worker = workerFor(t, a, (lease) => {
    seen.push(lease);
    return { taskId: lease.taskId, echoed: lease.json() };
  }, { pool: "gpu", onConnect: (info) => targets.push(info.target) });
  await worker.connected;
  assert.deepEqual(targets, [`http://127.0.0.1:${ports.b}`]);
  const client = clientFor(t, a);   // a forwards calls for pool gpu to b
  const sub = await client.submit({ big: "9007199254740993" }, { pool: "gpu", wait: true });
  const id = BigInt(sub.id);
  assert.ok(id > 2n ** 53n, `id ${sub.id}`);
  assert.equal(id >> 56n, 2n);   // shard b's number
  assert.equal(sub.result!.json<{ taskId: string }>().taskId, sub.id);
  assert.equal(seen[0]!.taskId, sub.id);
  assert.ok(BigInt(seen[0]!.id) > 2n ** 53n, `lease ${seen[0]!.id}`);
  // By string and by BigInt, through either server.
  assert.equal((await client.get(sub.id)).id, sub.id);
  assert.equal((await clientFor(t, b).get(id)).id, sub.id);
  assert.equal((await client.wait(id)).status, "succeeded");
  const page = await client.list({ pools: ["gpu"] });
  assert.deepEqual(page.tasks.map((task) => task.id), [sub.id]);
  // The id one above, which a Number would round onto this one, is another task (none).
  await assert.rejects(client.get(id + 1n), (error: Error & { code?: string }) => error.code === "NOT_FOUND");
  await assert.rejects(client.get(Number(id) as unknown as string), TypeError);
});
