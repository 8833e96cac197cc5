// The examples of docs/typescript.md: they run, and the page shows them as they are.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { demo } from "../examples/client.js";
import { fromPage } from "../examples/web.js";
import { serve } from "../examples/worker.js";
import { CLIENT, METRICS, ROOT, WORKER, clientFor, config, later, serverFor, until } from "./serverkit.js";

const PACKAGE = join(ROOT, "clients", "typescript");
const EXAMPLES = ["examples/worker.ts", "examples/client.ts", "examples/web.ts"];

test("docs/typescript.md shows each example file exactly", () => {
  const page = readFileSync(join(ROOT, "docs", "typescript.md"), "utf8");
  for (const file of EXAMPLES) {
    const marker = `<!-- file: clients/typescript/${file} -->\n\`\`\`ts\n`;
    const at = page.indexOf(marker);
    assert.ok(at >= 0, `docs/typescript.md has no block marked ${file}`);
    const start = at + marker.length;
    const block = page.slice(start, page.indexOf("```\n", start));
    assert.equal(block, readFileSync(join(PACKAGE, file), "utf8"), `docs/typescript.md's copy of ${file} differs`);
  }
});

test("the worker and client examples run against a server", async (t) => {
  const server = await serverFor(t);
  const stop = new AbortController();
  const serving = serve(server.target, WORKER, stop.signal);
  later(t, async () => { stop.abort(); await serving; });
  const metrics = clientFor(t, server, METRICS);
  await until(async () => (await metrics.workers()).length === 1, "the example worker connects");
  assert.deepEqual(await demo(server.target, CLIENT), [
    '{"doubled":42,"attempt":2}',
    "true true",
    "1: retrying, 2: succeeded",
    "failed: the payload has no number n",
    "job-21",
  ]);
});

test("the browser example runs over gRPC-Web", async (t) => {
  const text = config(["default"]);
  const cut = text.indexOf("[[auth.tokens]]");
  const server = await serverFor(t, text.slice(0, cut) + '[server.grpc_web]\nallowed_origins = ["https://app.example"]\n'
    + text.slice(cut));
  const stop = new AbortController();
  const serving = serve(server.target, WORKER, stop.signal);
  later(t, async () => { stop.abort(); await serving; });
  assert.deepEqual(await fromPage(`http://127.0.0.1:${server.httpPort}`, CLIENT),
    ['{"doubled":10,"attempt":1}', "succeeded", "watched"]);
});

test("the worker example as a program drains on SIGTERM and exits 0", async (t) => {
  const server = await serverFor(t);
  const script = fileURLToPath(new URL("../examples/worker.js", import.meta.url));
  const child = spawn(process.execPath, [script, server.target], {
    env: { ...process.env, CRONOQ_TOKEN: WORKER }, stdio: ["ignore", "ignore", "inherit"],
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  later(t, async () => {
    if (child.exitCode === null) {
      process.kill(child.pid!, "SIGKILL");
      await exited;
    }
  });
  const client = clientFor(t, server);
  const metrics = clientFor(t, server, METRICS);
  await until(async () => (await metrics.workers()).length === 1, "the worker process connects");
  const sub = await client.submit({ n: 2 }, { wait: true });
  assert.deepEqual(sub.result!.json(), { doubled: 4, attempt: 1 });
  process.kill(child.pid!, "SIGTERM");
  assert.equal(await exited, 0);
  await until(async () => (await metrics.workers()).length === 0, "the worker leaves the server's list");
});
