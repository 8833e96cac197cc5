// Client: submit and follow tasks on a cronoq-server (the Tasks service, and
// the Admin service's worker list).
import * as grpc from "@grpc/grpc-js";
import { errorFrom, isServiceError } from "./errors.js";
import { serviceConstructors } from "./proto.js";
import type { AttemptMessage, ListTasksResponseMessage, StatusEventMessage, SubmitResponseMessage, TaskInfoMessage,
  TaskResultMessage, WorkerInfoMessage } from "./proto.js";
import { CHANNEL_OPTIONS, bearer, checkpointFrom, conditionName, dateOf, endpoint, priorityName, refMessage,
  statusName, statusWire, taskMessage } from "./wire.js";
import type { Checkpoint, Priority, TaskOptions, TaskRef, TaskStatus, TlsOptions } from "./wire.js";

export interface ClientOptions {
  /** A client token, sent as "authorization: Bearer <token>". */
  token?: string;
  tls?: TlsOptions;
  /** Seconds for which calls answered UNAVAILABLE are retried with backoff. Default 15. */
  retryFor?: number;
  channelOptions?: grpc.ChannelOptions;
}

/** A finished task. `output` is set when it succeeded and the server still keeps it. */
export class TaskResult {
  constructor(
    readonly id: string,
    readonly status: TaskStatus,
    readonly output: Buffer | null,
    readonly contentType: string,
    readonly message: string | null,
    readonly outputAvailable: boolean,
  ) {}

  get ok(): boolean {
    return this.status === "succeeded";
  }

  /** The output parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.required().toString("utf8")) as T;
  }

  /** The output as UTF-8 text. */
  text(): string {
    return this.required().toString("utf8");
  }

  private required(): Buffer {
    if (this.output === null) {
      throw new Error(`task ${this.id} has no output (${this.status}${this.message ? ": " + this.message : ""})`);
    }
    return this.output;
  }

  /** @internal */
  static from(m: TaskResultMessage): TaskResult {
    return new TaskResult(m.id, statusName(m.status), m.output_available ? m.output : null, m.content_type,
      m.message || null, m.output_available);
  }
}

export interface Submission {
  id: string;
  /** The key named an existing task (whose id this is). */
  duplicate: boolean;
  /** With `wait`: the result. */
  result: TaskResult | null;
}

export interface AttemptInfo {
  attempt: number;
  /** How it ended; null while it runs. */
  status: TaskStatus | null;
  message: string | null;
  started: Date | null;
  ended: Date | null;
}

export interface TaskInfo {
  id: string;
  status: TaskStatus;
  pool: string;
  key: string | null;
  kind: string;
  attempt: number;
  maxAttempts: number;
  message: string | null;
  outputAvailable: boolean;
  priority: Priority;
  tenant: string | null;
  tags: Record<string, string>;
  labels: Record<string, string>;
  created: Date | null;
  started: Date | null;
  finished: Date | null;
  stages: string[] | null;
  /** From get() only, in stage order. */
  checkpoints: Checkpoint[];
  /** The latest attempts, oldest first. */
  attempts: AttemptInfo[];
  deps: { ref: string | { key: string }; on: "success" | "failure" | "complete" }[];
}

export interface TaskPage {
  tasks: TaskInfo[];
  /** Pass as `after` for the next page; null on the last one. */
  nextAfter: string | null;
  unavailableShards: string[];
}

export interface StatusEvent {
  id: string;
  pool: string;
  key: string | null;
  status: TaskStatus;
  attempt: number;
  at: Date | null;
  message: string | null;
  /** Set (with status "running") when a stage's checkpoint was saved. */
  stage: string | null;
  maxAttempts: number | null;
}

export interface WorkerInfo {
  id: string;
  name: string;
  pool: string;
  labels: Record<string, string>;
  slots: number;
  busy: number;
  connected: Date | null;
  health: "healthy" | "suspect";
  leaseExpiries: string;
  lastSeen: Date | null;
}

export interface SubmitOptions extends TaskOptions {
  /** Resolve once the task finished, with its result. */
  wait?: boolean;
  /** Seconds to wait at most (a ServerError DEADLINE_EXCEEDED after; the task keeps running). */
  waitTimeout?: number;
}

/** One task of submitBatch: its payload and options. */
export interface BatchTask extends TaskOptions {
  payload?: unknown;
}

function attemptFrom(m: AttemptMessage): AttemptInfo {
  return {
    attempt: m.attempt,
    status: m.status && m.status !== "TASK_STATUS_UNSPECIFIED" ? statusName(m.status) : null,
    message: m.message || null,
    started: dateOf(m.started_unix_ns),
    ended: dateOf(m.ended_unix_ns),
  };
}

function taskInfoFrom(m: TaskInfoMessage): TaskInfo {
  return {
    id: m.id,
    status: statusName(m.status),
    pool: m.pool,
    key: m.key || null,
    kind: m.kind,
    attempt: m.attempt,
    maxAttempts: m.max_attempts,
    message: m.message || null,
    outputAvailable: m.output_available,
    priority: priorityName(m.priority),
    tenant: m.tenant || null,
    tags: { ...m.tags },
    labels: { ...m.labels },
    created: dateOf(m.created_unix_ns),
    started: dateOf(m.started_unix_ns),
    finished: dateOf(m.finished_unix_ns),
    stages: m.stages.length ? [...m.stages] : null,
    checkpoints: m.checkpoints.map(checkpointFrom),
    attempts: m.attempts.map(attemptFrom),
    deps: m.deps.map((d) => ({ ref: d.ref.ref === "key" ? { key: d.ref.key! } : d.ref.id!,
      on: conditionName(d.cond) })),
  };
}

type Unary = (request: unknown, metadata: grpc.Metadata, options: grpc.CallOptions,
              callback: (error: grpc.ServiceError | null, response: unknown) => void) => grpc.ClientUnaryCall;

/** A client of a cronoq-server's gRPC API. It connects on first use; `close()` when done. */
export class Client {
  readonly target: string;
  private readonly metadata: grpc.Metadata;
  private readonly retryFor: number;
  private tasksClient: grpc.Client | null = null;
  private adminClient: grpc.Client | null = null;

  constructor(target: string, private readonly options: ClientOptions = {}) {
    this.target = target;
    this.metadata = bearer(options.token);
    const retryFor = options.retryFor ?? 15;
    if (!(retryFor >= 0)) {
      throw new RangeError(`retryFor must be a number of seconds >= 0, got ${String(retryFor)}`);
    }
    this.retryFor = retryFor;
    endpoint(target, options.tls);   // refuses TLS settings with http:// at once
  }

  private stubs(): { tasks: grpc.Client; admin: grpc.Client } {
    if (this.tasksClient === null || this.adminClient === null) {
      const { address, credentials } = endpoint(this.target, this.options.tls);
      const { Tasks, Admin } = serviceConstructors();
      this.tasksClient = new Tasks(address, credentials, { ...CHANNEL_OPTIONS, ...this.options.channelOptions });
      this.adminClient = new Admin(address, credentials, { channelOverride: this.tasksClient.getChannel() });
    }
    return { tasks: this.tasksClient, admin: this.adminClient };
  }

  close(): void {
    this.adminClient?.close();
    this.tasksClient?.close();
    this.adminClient = this.tasksClient = null;
  }

  /** One unary call, retrying UNAVAILABLE with jittered backoff for up to `retryFor` seconds. */
  private async call<T>(service: "tasks" | "admin", method: string, request: unknown): Promise<T> {
    const stub = this.stubs()[service] as unknown as Record<string, Unary>;
    const giveUp = Date.now() + this.retryFor * 1000;
    let delay = 0.05;
    for (;;) {
      try {
        return await new Promise<T>((resolve, reject) => {
          stub[method]!.call(stub, request, this.metadata, {}, (error, response) => {
            if (error) {
              reject(error);
            } else {
              resolve(response as T);
            }
          });
        });
      } catch (error) {
        if (!isServiceError(error)) {
          throw error;
        }
        if (error.code === grpc.status.UNAVAILABLE && Date.now() + delay * 1000 < giveUp) {
          await new Promise((resolve) => setTimeout(resolve, delay * 1000 * (0.5 + Math.random() / 2)));
          delay = Math.min(delay * 2, 2);
          continue;
        }
        throw errorFrom(error);
      }
    }
  }

  /** Submit one task. `payload`: a Buffer (as it is), a string (UTF-8 text)
   * or a JSON value. With `wait: true` it resolves once the task finished. */
  async submit(payload?: unknown, options: SubmitOptions = {}): Promise<Submission> {
    const { wait, waitTimeout, ...task } = options;
    const request = { task: taskMessage(payload, task), wait: wait ?? false,
      ...(waitTimeout !== undefined && { wait_timeout_s: waitTimeout }) };
    const response = await this.call<SubmitResponseMessage>("tasks", "Submit", request);
    return { id: response.id, duplicate: response.duplicate,
      result: response.result ? TaskResult.from(response.result) : null };
  }

  /** Submit tasks atomically: all or none. */
  async submitBatch(tasks: BatchTask[]): Promise<Submission[]> {
    const request = { tasks: tasks.map(({ payload, ...options }) => taskMessage(payload, options)) };
    const response = await this.call<{ tasks: SubmitResponseMessage[] }>("tasks", "SubmitBatch", request);
    return response.tasks.map((r) => ({ id: r.id, duplicate: r.duplicate, result: null }));
  }

  /** The task with this id (a string or BigInt) or `{key}`; a ServerError
   * NOT_FOUND (kind "UnknownTask") if the server knows none. */
  async get(ref: TaskRef): Promise<TaskInfo> {
    return taskInfoFrom(await this.call<TaskInfoMessage>("tasks", "Get", { task: refMessage(ref) }));
  }

  /** Wait until the task finished, at most `timeout` seconds (capped by the
   * server's limits.max_wait_s): its result, or a ServerError DEADLINE_EXCEEDED. */
  async wait(ref: TaskRef, options: { timeout?: number } = {}): Promise<TaskResult> {
    const request = { task: refMessage(ref), ...(options.timeout !== undefined && { timeout_s: options.timeout }) };
    return TaskResult.from(await this.call<TaskResultMessage>("tasks", "Wait", request));
  }

  /** Cancel a task: true if this call cancelled it, false if it had finished. */
  async cancel(ref: TaskRef): Promise<boolean> {
    const response = await this.call<{ cancelled: boolean }>("tasks", "Cancel", { task: refMessage(ref) });
    return response.cancelled;
  }

  /** One page of tasks in id order. */
  async list(options: { pools?: string[]; statuses?: TaskStatus[]; after?: string | bigint; limit?: number } = {}):
    Promise<TaskPage> {
    const request = {
      pools: options.pools ?? [],
      statuses: (options.statuses ?? []).map(statusWire),
      after: options.after === undefined ? "0" : refMessage(options.after).id!,
      limit: options.limit ?? 100,
    };
    const response = await this.call<ListTasksResponseMessage>("tasks", "ListTasks", request);
    return { tasks: response.tasks.map(taskInfoFrom),
      nextAfter: response.next_after && response.next_after !== "0" ? response.next_after : null,
      unavailableShards: [...response.unavailable_shards] };
  }

  /** Status events as they happen, until `signal` aborts (the iterator then
   * ends), the server stops serving (ServerError UNAVAILABLE) or the reader
   * falls behind (ServerError DATA_LOSS). `recent`: first up to that many of
   * the latest matching events the server kept. */
  async *watch(options: { pools?: string[]; terminalOnly?: boolean; recent?: number; signal?: AbortSignal } = {}):
    AsyncGenerator<StatusEvent, void, undefined> {
    const stub = this.stubs().tasks as unknown as Record<string,
      (request: unknown, metadata: grpc.Metadata) => grpc.ClientReadableStream<StatusEventMessage>>;
    const call = stub["Watch"]!.call(stub, { pools: options.pools ?? [], terminal_only: options.terminalOnly ?? false,
      recent: options.recent ?? 0 }, this.metadata);
    const signal = options.signal;
    const onAbort = (): void => call.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      if (signal?.aborted) {
        return;
      }
      for await (const m of call as AsyncIterable<StatusEventMessage>) {
        yield { id: m.id, pool: m.pool, key: m.key || null, status: statusName(m.status), attempt: m.attempt,
          at: dateOf(m.at_unix_ns), message: m.message || null, stage: m.stage || null,
          maxAttempts: m.max_attempts || null };
      }
    } catch (error) {
      if (isServiceError(error)) {
        if (error.code === grpc.status.CANCELLED && signal?.aborted) {
          return;
        }
        throw errorFrom(error);
      }
      throw error;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      call.cancel();
    }
  }

  /** Connected workers (a metrics token). */
  async workers(options: { pools?: string[] } = {}): Promise<WorkerInfo[]> {
    const response = await this.call<{ workers: WorkerInfoMessage[] }>("admin", "ListWorkers",
      { pools: options.pools ?? [] });
    return response.workers.map((w) => ({
      id: w.id, name: w.name, pool: w.pool, labels: { ...w.labels }, slots: w.slots, busy: w.busy,
      connected: dateOf(w.connected_unix_ns), health: w.health === "WORKER_HEALTH_SUSPECT" ? "suspect" : "healthy",
      leaseExpiries: w.lease_expiries, lastSeen: dateOf(w.last_seen_unix_ns),
    }));
  }
}


