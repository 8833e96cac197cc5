// TLS: the worker and the client verify the server against a private CA.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, runWorker } from "@cronoq/client";
import { CLIENT, ROOT, config, later, listen, serverFor, workerFor } from "./serverkit.js";

// A throwaway CA and a server certificate for 127.0.0.1, from tests/certkit.py.
const MAKE_CERTS = `
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from certkit import CA
ca = CA()
directory = Path(sys.argv[1])
(directory / "ca.pem").write_bytes(ca.pem)
ca.write(directory, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
`;

test("over TLS with a private CA: the worker serves and the client submits", async (t) => {
  const directory = mkdtempSync(join(tmpdir(), "cronoq-ts-tls-"));
  later(t, () => rmSync(directory, { recursive: true, force: true }));
  execFileSync(process.env["CRONOQ_PYTHON"] || "python3", ["-c", MAKE_CERTS, directory], { cwd: ROOT });
  const tls = `
[server.tls]
cert = "${join(directory, "server.pem")}"
key = "${join(directory, "server.key")}"
`;
  const base = config();
  const server = await serverFor(t, listen() + tls + base.slice(listen().length));
  const ca = readFileSync(join(directory, "ca.pem"));
  const worker = workerFor(t, server, (lease) => ({ secure: true, n: lease.json() }), { tls: { ca } });
  await worker.connected;
  const client = new Client(`https://${server.target}`, { token: CLIENT, tls: { ca } });
  later(t, () => client.close());
  const sub = await client.submit(7, { wait: true });
  assert.deepEqual(sub.result!.json(), { secure: true, n: 7 });
  // Without the CA the server's certificate is not trusted: the call fails, nothing is sent in plaintext.
  const untrusting = new Client(`https://${server.target}`, { retryFor: 0 });
  later(t, () => untrusting.close());
  await assert.rejects(untrusting.get("1"), (error: Error & { code?: string }) => error.code === "UNAVAILABLE");
});

test("TLS settings with an http:// target are refused before connecting", () => {
  assert.throws(() => new Client("http://127.0.0.1:1", { tls: true }), /refusing to connect in plaintext/);
  return assert.rejects(runWorker({ target: "http://127.0.0.1:1", pool: "default", tls: true }, () => null),
    /refusing to connect in plaintext/);
});
