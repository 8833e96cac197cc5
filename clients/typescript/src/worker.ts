// runWorker: serve a pool of a cronoq-server from this Node process, over the
// Workers.Work stream (worker protocol version 3; docs/server.md). The
// behaviour follows the Python worker (cronoq/client/worker.py).
import * as grpc from "@grpc/grpc-js";
import { CheckpointError, Cancelled, CronoqError, Permanent, Reject, Retryable, errorFrom, isServiceError,
  metadataValue } from "./errors.js";
import { PROTOCOL_VERSION, serviceConstructors } from "./proto.js";
import type { Int64, LeaseMessage, RegisteredMessage, ServerMessage, WorkerMessage } from "./proto.js";
import { CHANNEL_OPTIONS, bearer, checkpointFrom, cleanMessage, dateOf, decode, encode, endpoint, isLoopback,
  priorityName } from "./wire.js";
import type { Checkpoint, Priority, TlsOptions } from "./wire.js";

/** Why the server (or this worker) gave an attempt up. */
export type AbortReason = "cancelled" | "timeout" | "lease expired" | "shutdown" | "disconnected" | "unknown";

const ABORT_REASONS: Record<string, AbortReason> = {
  ABORT_REASON_CANCELLED: "cancelled",
  ABORT_REASON_TIMEOUT: "timeout",
  ABORT_REASON_LEASE_EXPIRED: "lease expired",
  ABORT_REASON_SHUTDOWN: "shutdown",
};
const MAX_REDIRECTS = 3;
// Status codes that retrying cannot fix: runWorker rejects with them.
const FATAL = new Set([grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED, grpc.status.NOT_FOUND,
  grpc.status.FAILED_PRECONDITION, grpc.status.INVALID_ARGUMENT, grpc.status.UNIMPLEMENTED]);
const BATCH_LIMIT = 512;

export interface WorkerLogger {
  info(message: string): void;
  warn(message: string): void;
}

const DEFAULT_LOGGER: WorkerLogger = {
  info: () => {},
  warn: (message) => process.stderr.write(`cronoq worker: ${message}\n`),
};

export interface WorkerOptions {
  /** host:port, or an http:// or https:// URL (https implies TLS). */
  target: string;
  pool: string;
  /** Leases to run at once (the server may grant fewer). Default 1. */
  slots?: number;
  /** A worker token, sent as "authorization: Bearer <token>". */
  token?: string;
  labels?: Record<string, string>;
  /** Shown in the server's worker list. Default "node-<pid>". */
  name?: string;
  /** Aborting it drains the worker: no new leases, running ones get `drainTimeout`. */
  signal?: AbortSignal;
  /** Seconds running handlers get after `signal` aborts. Default 30. */
  drainTimeout?: number;
  tls?: TlsOptions;
  /** Reconnection delays, seconds. Defaults 0.2 and 10. */
  initialBackoff?: number;
  maxBackoff?: number;
  /** Follow shard redirects to plain http:// on another host with the token (trusted networks only). */
  insecureRedirectHttp?: boolean;
  /** Called once each stream is registered. */
  onConnect?: (info: { workerId: string; slots: number; leaseTtl: number; target: string }) => void;
  logger?: WorkerLogger;
  /** Extra gRPC channel options. */
  channelOptions?: grpc.ChannelOptions;
}

/** What a handler returns: the task's output (a Buffer as it is, a string as
 * UTF-8 text, anything else as JSON). */
export type Handler = (lease: Lease) => unknown | Promise<unknown>;

/** One attempt of a task, leased to this worker. */
export class Lease {
  /** The lease: unique per attempt (a decimal uint64). */
  readonly id: string;
  readonly taskId: string;
  readonly attempt: number;
  readonly pool: string;
  readonly payload: Buffer;
  readonly contentType: string;
  readonly kind: string;
  readonly key: string | null;
  readonly tags: Readonly<Record<string, string>>;
  readonly labels: Readonly<Record<string, string>>;
  readonly priority: Priority;
  readonly tenant: string | null;
  /** The attempt's time limit in seconds (the server enforces it), or null. */
  readonly timeout: number | null;
  readonly deadline: Date | null;
  /** Seconds without a heartbeat after which the server gives the lease up. */
  readonly leaseTtl: number;
  /** Declared pipeline stages, or null. */
  readonly stages: readonly string[] | null;
  /** Aborted when the attempt is given up; `abortReason` then says why. */
  readonly signal: AbortSignal;
  private readonly controller = new AbortController();
  private readonly saved = new Map<string, Checkpoint>();
  private abortedFor: AbortReason | null = null;

  /** @internal */
  constructor(m: LeaseMessage, leaseTtl: number, private readonly session: Session | null) {
    this.id = m.lease;
    this.taskId = m.task_id;
    this.attempt = m.attempt;
    this.pool = m.pool;
    this.payload = m.payload;
    this.contentType = m.content_type;
    this.kind = m.kind;
    this.key = m.key || null;
    this.tags = { ...m.tags };
    this.labels = { ...m.labels };
    this.priority = priorityName(m.priority);
    this.tenant = m.tenant || null;
    this.timeout = m.timeout_s ?? null;
    this.deadline = dateOf(m.deadline_unix_ns);
    this.leaseTtl = leaseTtl;
    this.stages = m.stages.length ? [...m.stages] : null;
    this.signal = this.controller.signal;
    for (const c of m.checkpoints) {
      this.saved.set(c.stage, checkpointFrom(c));
    }
  }

  /** null until the attempt is given up; then "cancelled" (the task ended: no
   * retry follows), "timeout" or "lease expired" (retryable failures),
   * "shutdown" (the server stops or lost leadership, or this worker drained
   * past its drainTimeout), "disconnected" (the stream broke), "unknown". */
  get abortReason(): AbortReason | null {
    return this.abortedFor;
  }

  /** @internal */
  abort(reason: AbortReason): void {
    if (this.abortedFor === null) {
      this.abortedFor = reason;
      this.controller.abort(new CronoqError(`the attempt was given up: ${reason}`));
    }
  }

  /** The payload parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.payload.toString("utf8")) as T;
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return this.payload.toString("utf8");
  }

  private ordered(): Checkpoint[] {
    if (this.stages === null) {
      return [...this.saved.values()];
    }
    return this.stages.flatMap((stage) => {
      const saved = this.saved.get(stage);
      return saved ? [saved] : [];
    });
  }

  /** Stage -> the data of its latest checkpoint, in stage order (decoded by
   * content type: JSON values, text as strings, else Buffers). */
  get checkpoints(): ReadonlyMap<string, unknown> {
    return new Map(this.ordered().map((c) => [c.stage, c.data]));
  }

  /** The latest checkpoint of `stage` (with its attempt and time), or null. */
  checkpointInfo(stage: string): Checkpoint | null {
    return this.saved.get(stage) ?? null;
  }

  get completedStages(): string[] {
    return this.ordered().map((c) => c.stage);
  }

  /** The last stage earlier attempts completed, or null. */
  get resumedFrom(): string | null {
    const earlier = this.ordered().filter((c) => c.attempt < this.attempt);
    return earlier.length ? earlier[earlier.length - 1]!.stage : null;
  }

  /** Save `data` (a Buffer, a string or a JSON value) as the checkpoint of
   * `stage`; resolves once the server stored it (CheckpointError says why it
   * refused). */
  async checkpoint(stage: string, data: unknown = null, contentType?: string): Promise<Checkpoint> {
    const session = this.session;
    if (session === null || !session.checkpoints) {
      throw new CronoqError("the server does not keep checkpoints for this worker (it did not accept "
        + "accept_checkpoints: upgrade the server)");
    }
    if (typeof stage !== "string" || stage === "") {
      throw new CheckpointError("stage must be a non-empty string");
    }
    let encoded: Buffer;
    let ctype: string;
    try {
      [encoded, ctype] = encode(data, contentType);
    } catch (error) {
      throw new CheckpointError(`the checkpoint of stage ${JSON.stringify(stage)}: ${(error as Error).message}`);
    }
    const error = await session.saveCheckpoint(this.id, stage, encoded, ctype);
    if (error) {
      throw new CheckpointError(error);
    }
    const saved: Checkpoint = { stage, data: decode(encoded, ctype), contentType: ctype, attempt: this.attempt,
      saved: new Date(), size: encoded.length };
    this.saved.set(stage, saved);
    return saved;
  }

  toString(): string {
    return `Lease(id=${this.id}, taskId=${this.taskId}, attempt=${this.attempt}, pool=${this.pool})`;
  }
}

/** One stream's state. */
class Session {
  registered = false;
  shut = false;
  notLeader = false;
  draining = false;
  ended = false;
  /** The worker half-closed: nothing more can be written. */
  sendClosed = false;
  checkpoints = false;
  granted = 0;
  leaseTtl = 30;
  maxBytes = 4 * 1024 * 1024;
  /** Leases this worker holds (running or waiting for a slot). */
  readonly held = new Map<string, Lease>();
  /** Leases received while every granted slot was busy, oldest first. */
  readonly waiting: Lease[] = [];
  /** Handlers not yet returned, aborted ones included: they hold their slot. */
  readonly active = new Map<Lease, Promise<void>>();
  private readonly out: WorkerMessage[] = [];
  private flushing = false;
  private seq = 0n;
  private readonly saving = new Map<string, (error: string) => void>();
  private readonly idle = new Set<() => void>();

  constructor(readonly call: grpc.ClientDuplexStream<WorkerMessage, ServerMessage>) {}

  send(message: WorkerMessage): void {
    if (this.ended || this.sendClosed) {
      return;
    }
    this.out.push(message);
    if (!this.flushing) {
      this.flushing = true;
      setImmediate(() => this.flush());
    }
  }

  /** Write what queued up as one batch (at most 512, within half of
   * max_message_bytes); what queues while that write is under way goes in
   * the next one, as the Python worker does. */
  private flush(): void {
    if (!this.out.length || this.ended || this.sendClosed) {
      this.flushing = false;
      this.flushed();
      return;
    }
    const limit = this.maxBytes / 2;
    const messages: WorkerMessage[] = [];
    let size = 0;
    while (this.out.length && messages.length < BATCH_LIMIT) {
      const next = this.out[0]!;
      const bytes = 32 + (next.complete?.output.length ?? 0) + (next.checkpoint?.data.length ?? 0)
        + (next.fail?.message.length ?? 0) * 3;
      if (messages.length && size + bytes > limit) {
        break;
      }
      messages.push(this.out.shift()!);
      size += bytes;
    }
    this.call.write(messages.length === 1 ? messages[0]! : { batch: { messages } }, () => this.flush());
  }

  private readonly written = new Set<() => void>();

  /** Resolves once everything queued so far was handed to the stream. */
  whenFlushed(): Promise<void> {
    if (!this.flushing) {
      return Promise.resolve();
    }
    return new Promise((resolve) => this.written.add(resolve));
  }

  private flushed(): void {
    for (const resolve of this.written) {
      resolve();
    }
    this.written.clear();
  }

  saveCheckpoint(lease: Int64, stage: string, data: Buffer, contentType: string): Promise<string> {
    if (this.ended || this.sendClosed) {
      return Promise.resolve("the worker's stream ended: the checkpoint was not saved");
    }
    this.seq += 1n;
    const seq = this.seq.toString();
    return new Promise<string>((resolve) => {
      this.saving.set(seq, resolve);
      this.send({ checkpoint: { lease, stage, data, content_type: contentType, seq } });
    });
  }

  checkpointSaved(seq: Int64, error: string): void {
    const resolve = this.saving.get(seq);
    if (resolve !== undefined) {
      this.saving.delete(seq);
      resolve(error);
    }
  }

  /** Resolves once no handler runs (or at once). */
  whenIdle(): Promise<void> {
    if (this.active.size === 0) {
      return Promise.resolve();
    }
    return new Promise((resolve) => this.idle.add(resolve));
  }

  handlerEnded(): void {
    if (this.active.size === 0) {
      for (const resolve of this.idle) {
        resolve();
      }
      this.idle.clear();
    }
  }

  /** The stream ended: unconfirmed checkpoints fail, nothing more is sent. */
  end(): void {
    this.ended = true;
    this.out.length = 0;
    this.flushed();
    for (const resolve of this.saving.values()) {
      resolve("the worker's stream ended before the server confirmed the checkpoint");
    }
    this.saving.clear();
  }
}

function sleep(seconds: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted || seconds <= 0) {
      resolve();
      return;
    }
    const timer = setTimeout(done, seconds * 1000);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

function positiveSeconds(value: number, field: string): number {
  if (typeof value !== "number" || !(value >= 0) || !Number.isFinite(value)) {
    throw new RangeError(`${field} must be a number of seconds >= 0, got ${String(value)}`);
  }
  return value;
}

/** The outcome message for what a handler threw. */
function failure(lease: Lease, error: unknown): WorkerMessage {
  if (error instanceof Reject) {
    return { nack: { lease: lease.id, reason: cleanMessage(error.reason) } };
  }
  if (error instanceof Cancelled) {
    return { cancelled: { lease: lease.id, message: cleanMessage(error.message) } };
  }
  if (error instanceof Retryable) {
    return { fail: { lease: lease.id, message: cleanMessage(error.message), permanent: false,
      ...(error.retryAfter !== null && { retry_after_s: error.retryAfter }) } };
  }
  if (error instanceof Permanent) {
    return { fail: { lease: lease.id, message: cleanMessage(error.message), permanent: true } };
  }
  let text: string;
  if (error instanceof Error) {
    text = error.stack || `${error.name}: ${error.message}`;
  } else {
    try {
      text = `thrown: ${String(error)}`;
    } catch {
      text = "thrown: a value that cannot be printed";
    }
  }
  return { fail: { lease: lease.id, message: cleanMessage(text), permanent: false } };
}

/**
 * Serve `options.pool` of the server at `options.target`: run `handler(lease)`
 * for every lease, at most the granted slots at once. Resolves once
 * `options.signal` aborted and the worker drained; rejects for what
 * retrying cannot fix (a rejected token, an unknown pool, a protocol version
 * the server does not speak), with a ServerError; reconnects after anything
 * else.
 */
export async function runWorker(options: WorkerOptions, handler: Handler): Promise<void> {
  if (typeof handler !== "function") {
    throw new TypeError(`handler must be a function, got ${typeof handler}`);
  }
  const slots = options.slots ?? 1;
  if (!Number.isInteger(slots) || slots < 1) {
    throw new RangeError(`slots must be an integer >= 1, got ${String(slots)}`);
  }
  const drainTimeout = positiveSeconds(options.drainTimeout ?? 30, "drainTimeout");
  const initialBackoff = positiveSeconds(options.initialBackoff ?? 0.2, "initialBackoff");
  const maxBackoff = positiveSeconds(options.maxBackoff ?? 10, "maxBackoff");
  const worker = new Worker(options, handler, slots, drainTimeout, initialBackoff, maxBackoff);
  return worker.run();
}

class Worker {
  private readonly stop: AbortSignal;
  private readonly logger: WorkerLogger;
  private readonly name: string;
  private readonly metadata: grpc.Metadata;
  private readonly secure: boolean;

  constructor(private readonly options: WorkerOptions, private readonly handler: Handler,
              private readonly slots: number, private readonly drainTimeout: number,
              private readonly initialBackoff: number, private readonly maxBackoff: number) {
    this.stop = options.signal ?? new AbortController().signal;
    this.logger = options.logger ?? DEFAULT_LOGGER;
    this.name = options.name ?? `node-${process.pid}`;
    this.metadata = bearer(options.token);
    this.secure = (options.tls !== undefined && options.tls !== false) || options.target.startsWith("https://");
    endpoint(options.target, options.tls);   // refuses TLS settings with http:// before anything starts
  }

  private client(target: string): grpc.Client {
    const tls = target.startsWith("http://") ? undefined : this.options.tls;
    const { address, credentials } = endpoint(target, tls);
    const Workers = serviceConstructors().Workers;
    return new Workers(address, credentials, { ...CHANNEL_OPTIONS, ...this.options.channelOptions });
  }

  /** The endpoint a sharded server sent this worker to, checked: at most three
   * redirects in a row, never from TLS to plain http://, the token over plain
   * http:// only to loopback unless allowed. */
  private redirect(error: grpc.ServiceError, chain: string[]): string | null {
    if (error.code !== grpc.status.FAILED_PRECONDITION) {
      return null;
    }
    const moved = metadataValue(error.metadata, "cronoq-shard-endpoint");
    if (!moved) {
      return null;
    }
    const pool = JSON.stringify(this.options.pool);
    if (chain.length > MAX_REDIRECTS) {
      throw new CronoqError(`pool ${pool}: more than ${MAX_REDIRECTS} shard redirects in a row `
        + `(${[...chain, moved].join(" -> ")})`);
    }
    if (moved.startsWith("http://")) {
      if (this.secure || chain[chain.length - 1]!.startsWith("https://")) {
        throw new CronoqError(`pool ${pool} is served at ${moved}: refusing to follow a redirect from TLS to `
          + "plain http://");
      }
      const host = new URL(moved).hostname;
      if (this.options.token && !isLoopback(host) && !this.options.insecureRedirectHttp) {
        throw new CronoqError(`pool ${pool} is served at ${moved}: refusing to send the token over plain http:// `
          + "to another host (insecureRedirectHttp: true allows it)");
      }
    }
    return moved;
  }

  async run(): Promise<void> {
    let backoff = this.initialBackoff;
    const chain = [this.options.target];   // the configured target, then the shards it sent this worker to
    let client = this.client(this.options.target);
    try {
      while (!this.stop.aborted) {
        let moved: string | null = null;
        let session: Session | null = null;
        try {
          session = await this.serve(client, chain[chain.length - 1]!);
        } catch (error) {
          if (!isServiceError(error)) {
            throw error;
          }
          moved = this.redirect(error, chain);
          if (moved === null && FATAL.has(error.code)) {
            throw errorFrom(error);
          }
          if (moved === null) {
            this.logger.warn(`the stream for pool ${this.options.pool} ended: ${grpc.status[error.code]} `
              + `${error.details}`);
          }
          session = (error as { session?: Session }).session ?? null;
        }
        if (this.stop.aborted) {
          break;
        }
        const registered = session?.registered ?? false;
        if (registered) {
          backoff = this.initialBackoff;
          chain.length = 1;
        }
        if (moved !== null || (chain.length > 1 && !registered)) {
          // Follow the redirect; or, that shard out of reach, ask the configured target again.
          client.close();
          if (moved !== null) {
            this.logger.info(`pool ${this.options.pool} is served at ${moved}: connecting there`);
            chain.push(moved);
            client = this.client(moved);
            continue;
          }
          chain.length = 1;
          client = this.client(this.options.target);
        }
        const notLeader = session?.notLeader ?? false;
        const delay = notLeader ? 0 : backoff * (0.5 + Math.random() / 2);
        if (!notLeader) {
          backoff = Math.min(Math.max(backoff * 2, this.initialBackoff), this.maxBackoff);
        }
        await sleep(delay, this.stop);
      }
    } finally {
      client.close();
    }
  }

  /** One stream, from Register to its end: resolves with its session, or
   * rejects with the ServiceError it ended with (its `session` attached). */
  private serve(client: grpc.Client, target: string): Promise<Session> {
    const Work = (client as unknown as {
      Work(metadata: grpc.Metadata): grpc.ClientDuplexStream<WorkerMessage, ServerMessage>;
    }).Work.bind(client);
    const call = Work(this.metadata.clone());
    const session = new Session(call);
    let heartbeats: NodeJS.Timeout | undefined;
    let settled = false;

    return new Promise<Session>((resolve, reject) => {
      const finish = (error: Error | null): void => {
        if (settled) {
          return;
        }
        settled = true;
        clearInterval(heartbeats);
        this.stop.removeEventListener("abort", onStop);
        session.end();
        for (const lease of session.held.values()) {
          lease.abort(session.shut || this.stop.aborted ? "shutdown" : "disconnected");
        }
        session.held.clear();
        session.waiting.length = 0;
        call.cancel();
        if (error === null) {
          resolve(session);
        } else {
          Object.assign(error, { session });
          reject(error);
        }
      };
      const onStop = (): void => {
        if (session.registered) {
          void this.drain(session).then(() => finish(null), (error: Error) => finish(error));
        } else {
          finish(null);
        }
      };

      call.on("data", (message: ServerMessage) => {
        if (settled) {
          return;
        }
        if (!session.registered) {
          let first = message;
          let rest: ServerMessage[] = [];
          if (first.msg === "batch" && first.batch!.messages.length) {
            [first, ...rest] = first.batch!.messages as [ServerMessage, ...ServerMessage[]];
          }
          if (first.msg !== "registered") {
            finish(new CronoqError(`the server answered Register with ${first.msg ?? "nothing"}`));
            return;
          }
          this.registered(session, first.registered!, target);
          heartbeats = setInterval(() => {
            for (const id of session.held.keys()) {
              session.send({ heartbeat: { lease: id } });
            }
          }, Math.max(session.leaseTtl / 3, 0.05) * 1000);
          for (const inner of rest) {
            if (this.receive(inner, session)) {
              finish(null);
              return;
            }
          }
          return;
        }
        const messages = message.msg === "batch" ? message.batch!.messages : [message];
        for (const inner of messages) {
          if (this.receive(inner, session)) {
            finish(null);
            return;
          }
        }
      });
      call.on("error", (error: Error) => finish(error));
      call.on("status", (status: grpc.StatusObject) => {
        if (status.code === grpc.status.OK) {
          finish(null);
        }
      });
      call.on("end", () => {
        // The read side ended; "status" (or "error") settles the stream.
      });
      if (this.stop.aborted) {
        finish(null);
        return;
      }
      this.stop.addEventListener("abort", onStop, { once: true });
      call.write({ register: {
        pool: this.options.pool, slots: this.slots, worker_name: this.name, protocol_version: PROTOCOL_VERSION,
        labels: { ...this.options.labels }, accept_batches: true, accept_checkpoints: true,
      } });
    });
  }

  private registered(session: Session, m: RegisteredMessage, target: string): void {
    session.registered = true;
    session.leaseTtl = m.lease_ttl_s || 30;
    session.granted = m.slots;
    session.maxBytes = m.max_message_bytes || session.maxBytes;
    session.checkpoints = m.checkpoints;
    this.logger.info(`connected to ${target}: worker ${m.worker_id} of pool ${this.options.pool} with ${m.slots} slots`);
    try {
      this.options.onConnect?.({ workerId: m.worker_id, slots: m.slots, leaseTtl: session.leaseTtl, target });
    } catch (error) {
      this.logger.warn(`onConnect threw: ${(error as Error).stack ?? String(error)}`);
    }
  }

  /** Act on one message from the server; true at Shutdown. */
  private receive(message: ServerMessage, session: Session): boolean {
    switch (message.msg) {
      case "lease": {
        const lease = new Lease(message.lease!, session.leaseTtl, session);
        if (session.draining) {
          // Sent before the server saw SetSlots 0: give it back unrun.
          session.send({ nack: { lease: lease.id, reason: "the worker is draining" } });
          break;
        }
        session.held.set(lease.id, lease);
        session.waiting.push(lease);
        this.startWaiting(session);
        break;
      }
      case "abort": {
        const abort = message.abort!;
        const lease = session.held.get(abort.lease);
        if (lease !== undefined) {
          session.held.delete(abort.lease);
          const at = session.waiting.indexOf(lease);
          if (at >= 0) {
            session.waiting.splice(at, 1);
          }
          lease.abort(ABORT_REASONS[abort.code] ?? "unknown");
        }
        if (abort.code === "ABORT_REASON_LEASE_EXPIRED") {
          // The server heard nothing from us for a lease TTL (a pause): any message
          // shows it this worker is alive again, so that it gets leases again.
          session.send({ heartbeat: { lease: abort.lease } });
        }
        break;
      }
      case "checkpoint_saved":
        session.checkpointSaved(message.checkpoint_saved!.seq, message.checkpoint_saved!.error);
        break;
      case "slots_granted":
        session.granted = message.slots_granted!.slots;
        this.startWaiting(session);
        break;
      case "shutdown":
        session.shut = true;
        session.notLeader = message.shutdown!.not_leader;
        this.logger.info(`the server asked this worker to go (${message.shutdown!.reason})`);
        return true;
      default:
        break;
    }
    return false;
  }

  /** Start waiting leases while fewer handlers run than the granted slots
   * (an aborted handler that has not returned yet still holds its slot). */
  private startWaiting(session: Session): void {
    while (session.waiting.length && session.active.size < session.granted && !session.draining) {
      const lease = session.waiting.shift()!;
      const running = this.runOne(lease, session).finally(() => {
        session.active.delete(lease);
        session.handlerEnded();
        if (!session.ended) {
          this.startWaiting(session);
        }
      });
      session.active.set(lease, running);
    }
  }

  private async runOne(lease: Lease, session: Session): Promise<void> {
    let message: WorkerMessage;
    try {
      const handler = this.handler;   // called as a plain function: no `this`
      const value = await handler(lease);
      try {
        const [output, contentType] = encode(value);
        message = { complete: { lease: lease.id, output, content_type: contentType } };
      } catch (error) {
        message = { fail: { lease: lease.id, permanent: true,
          message: cleanMessage(`the handler's output: ${(error as Error).message}`) } };
      }
    } catch (error) {
      message = failure(lease, error);
    }
    if (session.held.get(lease.id) === lease) {
      session.held.delete(lease.id);
      if (!lease.signal.aborted && !session.shut) {
        session.send(message);
      }
    }
  }

  /** `signal` aborted: take no more leases, give running ones drainTimeout,
   * fail what still runs, then half-close and wait for the server's end. */
  private async drain(session: Session): Promise<void> {
    session.draining = true;
    session.send({ set_slots: { slots: 0 } });
    for (const lease of session.waiting.splice(0)) {
      session.held.delete(lease.id);
      session.send({ nack: { lease: lease.id, reason: "the worker is draining" } });
    }
    if (session.active.size) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([session.whenIdle(),
        new Promise<void>((resolve) => { timer = setTimeout(resolve, this.drainTimeout * 1000); })]);
      clearTimeout(timer);
    }
    for (const lease of [...session.held.values()]) {
      session.held.delete(lease.id);
      lease.abort("shutdown");
      session.send({ fail: { lease: lease.id, message: "the worker stopped before the attempt finished",
        permanent: false } });
    }
    // Half-close once the queued reports are written; the server then ends the stream with OK.
    await session.whenFlushed();
    if (!session.ended) {
      session.sendClosed = true;
      session.call.end();
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 5000);
        session.call.once("status", () => { clearTimeout(timer); resolve(); });
        session.call.once("error", () => { clearTimeout(timer); resolve(); });
      });
    }
  }
}
