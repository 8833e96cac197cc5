// The browser entry (WebClient over gRPC-Web) against a real cronoq-server,
// called with Node's fetch as a page would call it with the browser's.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { WebClient, WebServerError } from "@cronoq/client/web";
import type { WebStatusEvent } from "@cronoq/client/web";
import { CLIENT, config, deferred, serverFor, until, workerFor } from "./serverkit.js";

const ORIGIN = "https://app.example";
const WEB = `
[server.grpc_web]
allowed_origins = ["${ORIGIN}"]
`;

function webConfig(): string {
  // [server.grpc_web] belongs to [server]: it goes before the other tables.
  const text = config(["default"]);
  const cut = text.indexOf("[[auth.tokens]]");
  return text.slice(0, cut) + WEB + text.slice(cut);
}

test("submit, get, wait, cancel and watch over gRPC-Web", async (t) => {
  const server = await serverFor(t, webConfig());
  const web = new WebClient(`http://127.0.0.1:${server.httpPort}`, { token: CLIENT });
  const events: WebStatusEvent[] = [];
  const stop = new AbortController();
  const watching = (async () => {
    for await (const event of web.watch({ pools: ["default"], signal: stop.signal })) events.push(event);
  })();
  const held = deferred();
  const worker = workerFor(t, server, async (lease) => {
    if (lease.kind === "hold") {
      held.resolve();
      await new Promise((resolve) => lease.signal.addEventListener("abort", resolve, { once: true }));
    }
    return { doubled: (lease.json() as { n: number }).n * 2 };
  });
  await worker.connected;
  const sub = await web.submit({ n: 21 }, { key: "web-1", priority: "high", tags: { from: "page" } });
  assert.match(sub.id, /^[0-9]+$/);
  assert.equal(sub.duplicate, false);
  assert.equal((await web.submit({ n: 0 }, { key: "web-1" })).duplicate, true);
  const result = await web.wait(sub.id, { timeout: 30 });
  assert.equal(result.status, "succeeded");
  assert.deepEqual(result.json(), { doubled: 42 });
  const info = await web.get({ key: "web-1" });
  assert.deepEqual([info.id, info.status, info.key, info.pool], [sub.id, "succeeded", "web-1", "default"]);
  assert.equal((await web.get(BigInt(sub.id))).id, sub.id);
  const hold = await web.submit({ n: 1 }, { kind: "hold" });
  await held.promise;
  assert.equal(await web.cancel(hold.id), true);
  assert.equal((await web.wait(hold.id)).status, "cancelled");
  assert.equal(await web.cancel(hold.id), false);
  await until(() => events.some((e) => e.id === hold.id && e.status === "cancelled"), "the watch saw the cancel");
  assert.ok(events.some((e) => e.id === sub.id && e.status === "succeeded"));
  assert.ok(events.every((e) => e.at instanceof Date && e.pool === "default"));
  stop.abort();
  await watching;
});

test("refusals reject with the server's gRPC code and cronoq kind", async (t) => {
  const server = await serverFor(t, webConfig());
  const web = new WebClient(`http://127.0.0.1:${server.httpPort}`, { token: CLIENT });
  await assert.rejects(web.get("123456789012345678"),
    (error: unknown) => error instanceof WebServerError && error.code === "NOT_FOUND" && error.kind === "UnknownTask");
  await assert.rejects(web.submit({}, { pool: "nope" }),
    (error: unknown) => error instanceof WebServerError && error.kind === "UnknownPool" && /nope/.test(error.message));
  await assert.rejects(new WebClient(`http://127.0.0.1:${server.httpPort}`).get("1"),
    (error: unknown) => error instanceof WebServerError && error.code === "UNAUTHENTICATED");
  await assert.rejects(web.wait("1", { timeout: 0.1 }),
    (error: unknown) => error instanceof WebServerError && error.code === "NOT_FOUND");
  await assert.rejects(web.get(2n ** 64n), RangeError);
  const watch = new WebClient(`http://127.0.0.1:${server.httpPort}`, { token: "not-a-token-0123456789abcdef" });
  await assert.rejects(async () => { for await (const _ of watch.watch()) break; },
    (error: unknown) => error instanceof WebServerError && error.code === "UNAUTHENTICATED");
});

test("the browser entry imports no Node module", () => {
  const source = readFileSync(new URL("../../dist/web.js", import.meta.url), "utf8");
  const imports = [...source.matchAll(/^import .* from "([^"]+)";$/gm)].map((m) => m[1]);
  assert.deepEqual(imports, ["protobufjs/light.js", "./descriptor.generated.js"]);
  assert.doesNotMatch(source, /\bBuffer\b|node:/);
});
