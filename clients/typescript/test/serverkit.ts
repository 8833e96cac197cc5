// Real cronoq-server processes for the tests: `python -m cronoq.server
// --config FILE` with listeners on port 0 of 127.0.0.1 (the server binds its
// own ports and logs them in its "listening:" line), stopped by pid. The
// interpreter is $CRONOQ_PYTHON (default python3); the repository's root goes
// on its PYTHONPATH.
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { TestContext } from "node:test";
import { Client, runWorker } from "@cronoq/client";
import type { Handler, WorkerOptions } from "@cronoq/client";

// build/test/serverkit.js -> the repository's root.
export const ROOT = fileURLToPath(new URL("../../../../", import.meta.url));

export const CLIENT = "client-token-0123456789abcdef0123";
export const WORKER = "worker-token-0123456789abcdef0123";
export const METRICS = "metrics-token-0123456789abcdef012";

export const AUTH = `
[[auth.tokens]]
token = "${CLIENT}"
role = "client"
[[auth.tokens]]
token = "${WORKER}"
role = "worker"
[[auth.tokens]]
token = "${METRICS}"
role = "metrics"
`;

export function listen(grpcPort = 0): string {
  return `
[server]
grpc_addr = "127.0.0.1:${grpcPort}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
`;
}

/** A server section, the tokens and one pool per name (fast retries, a short lease TTL). */
export function config(pools: string[] = ["default"], extra = ""): string {
  return listen() + AUTH + pools.map((name) => `
[[pools]]
name = "${name}"
lease_ttl_s = 2
retry = { max_attempts = 3, initial_backoff_s = 0.01, jitter = false }
`).join("") + extra;
}

const LISTENING = /listening: grpc [^ ]+:(\d+), http https?:\/\/[^ ]+:(\d+)/;

export class ServerProcess {
  readonly lines: string[] = [];
  grpcPort = 0;
  httpPort = 0;
  private readonly process: ChildProcess;
  private readonly waiters = new Set<() => void>();
  private exited = false;
  private readonly directory: string;

  constructor(configText: string, args: string[] = []) {
    this.directory = mkdtempSync(join(tmpdir(), "cronoq-ts-"));
    const path = join(this.directory, "server.toml");
    writeFileSync(path, configText);
    const python = process.env["CRONOQ_PYTHON"] || "python3";
    const env: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: [ROOT, process.env["PYTHONPATH"]].filter(Boolean).join(":") };
    delete env["CRONOQ_CONFIG"];
    this.process = spawn(python, ["-m", "cronoq.server", ...args, "--config", path],
      { cwd: ROOT, env, stdio: ["ignore", "ignore", "pipe"] });
    let partial = "";
    this.process.stderr!.setEncoding("utf8");
    this.process.stderr!.on("data", (chunk: string) => {
      partial += chunk;
      const parts = partial.split("\n");
      partial = parts.pop()!;
      for (const line of parts) {
        this.lines.push(line);
        const match = LISTENING.exec(line);
        if (match) {
          this.grpcPort = Number(match[1]);
          this.httpPort = Number(match[2]);
        }
      }
      this.notify();
    });
    this.process.on("exit", () => {
      this.exited = true;
      this.notify();
    });
  }

  get target(): string {
    return `127.0.0.1:${this.grpcPort}`;
  }

  get pid(): number {
    return this.process.pid!;
  }

  private notify(): void {
    for (const waiter of this.waiters) {
      waiter();
    }
  }

  count(text: string): number {
    return this.lines.filter((line) => line.includes(text)).length;
  }

  /** Resolves once `text` appeared in the log `occurrences` times. */
  waitFor(text: string, timeout = 30, occurrences = 1): Promise<void> {
    return new Promise((resolve, reject) => {
      const check = (): void => {
        if (this.count(text) >= occurrences) {
          done();
          resolve();
        } else if (this.exited) {
          done();
          reject(new Error(`the server exited before it logged ${JSON.stringify(text)}:\n${this.lines.join("\n")}`));
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`the server did not log ${JSON.stringify(text)} in ${timeout} s:\n${this.lines.join("\n")}`));
      }, timeout * 1000);
      const done = (): void => {
        clearTimeout(timer);
        this.waiters.delete(check);
      };
      this.waiters.add(check);
      check();
    });
  }

  async start(waitFor = "serving as the leader"): Promise<this> {
    await this.waitFor("listening: grpc");
    await this.waitFor(waitFor);
    return this;
  }

  /** SIGTERM by pid, then SIGKILL if it lingers. */
  async stop(): Promise<void> {
    if (!this.exited) {
      const exited = new Promise<void>((resolve) => this.process.once("exit", () => resolve()));
      process.kill(this.pid, "SIGTERM");
      const timer = setTimeout(() => {
        if (!this.exited) {
          process.kill(this.pid, "SIGKILL");
        }
      }, 20_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.directory, { recursive: true, force: true });
  }
}

const CLEANUPS = new WeakMap<TestContext, (() => unknown)[]>();

/** Run `fn` after the test, in reverse order of registration (workers stop
 * before the servers they serve). */
export function later(t: TestContext, fn: () => unknown): void {
  let stack = CLEANUPS.get(t);
  if (stack === undefined) {
    const fns: (() => unknown)[] = [];
    stack = fns;
    CLEANUPS.set(t, fns);
    t.after(async () => {
      for (const cleanup of fns.reverse()) {
        await cleanup();
      }
    });
  }
  stack.push(fn);
}

/** A server started for this test and stopped after it. */
export async function serverFor(t: TestContext, configText = config(), args: string[] = []): Promise<ServerProcess> {
  const server = new ServerProcess(configText, args);
  later(t, () => server.stop());
  return server.start();
}

export function clientFor(t: TestContext, server: ServerProcess, token = CLIENT): Client {
  const client = new Client(server.target, { token });
  later(t, () => client.close());
  return client;
}

export interface RunningWorker {
  /** Resolves once registered (the first time). */
  connected: Promise<{ workerId: string; slots: number; target: string }>;
  /** Drain it (as on SIGTERM) and wait until runWorker resolved. */
  stop(): Promise<void>;
  /** runWorker's promise. */
  done: Promise<void>;
  controller: AbortController;
}

/** runWorker for this test (a worker token, fast reconnects), drained after it. */
export function workerFor(t: TestContext, server: ServerProcess | string, handler: Handler,
                          options: Partial<WorkerOptions> = {}): RunningWorker {
  const controller = new AbortController();
  let connected!: (info: { workerId: string; slots: number; target: string }) => void;
  const connectedOnce = new Promise<{ workerId: string; slots: number; target: string }>((resolve) => {
    connected = resolve;
  });
  const done = runWorker({
    target: typeof server === "string" ? server : server.target, pool: "default", token: WORKER,
    initialBackoff: 0.05, maxBackoff: 0.5, drainTimeout: 2, signal: controller.signal,
    ...options,
    onConnect: (info) => {
      connected(info);
      options.onConnect?.(info);
    },
  }, handler);
  done.catch(() => {});
  const stop = async (): Promise<void> => {
    controller.abort();
    await done;
  };
  later(t, async () => {
    controller.abort();
    await done.catch(() => {});   // a test that expected it to reject has checked that
  });
  return { connected: connectedOnce, stop, done, controller };
}

/** Polls `check` until it holds (every 20 ms, up to `timeout` seconds). */
export async function until(check: () => boolean | Promise<boolean>, what: string, timeout = 20): Promise<void> {
  const give = Date.now() + timeout * 1000;
  while (!(await check())) {
    if (Date.now() > give) {
      throw new Error(`timed out waiting until ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A promise and its resolve function. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => { resolve = r; });
  return { promise, resolve };
}

/** A port free on 127.0.0.1 now (for configurations that must name one in advance). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const port = (probe.address() as AddressInfo).port;
      probe.close(() => resolve(port));
    });
  });
}

/** Two shards, a (pool default, number 1) and b (pool gpu, number 2): the
 * configuration of shard `name`, listening on its port. Task ids carry the
 * shard number in their top 8 bits, so every id is above 2^56. */
export function shardsConfig(ports: { a: number; b: number }, name: "a" | "b"): string {
  return listen(ports[name]) + AUTH + `
[[pools]]
name = "default"
retry = { max_attempts = 3, initial_backoff_s = 0.01 }
[[pools]]
name = "gpu"
retry = { max_attempts = 3, initial_backoff_s = 0.01 }
[[shards]]
name = "a"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:${ports.a}"
[[shards]]
name = "b"
number = 2
pools = ["gpu"]
endpoint = "http://127.0.0.1:${ports.b}"
`;
}
