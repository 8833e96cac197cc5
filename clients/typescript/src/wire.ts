// Conversions between JavaScript values and the cronoq.v1 messages, shared by
// the Client and the worker.
import * as grpc from "@grpc/grpc-js";
import type { DepMessage, Int64, StageCheckpointMessage, TaskRefMessage, TaskSpecMessage } from "./proto.js";

export const OCTETS = "application/octet-stream";
export const JSON_TYPE = "application/json";
export const TEXT = "text/plain; charset=utf-8";
const MAX_MESSAGE = 8192;
const UINT64_MAX = (1n << 64n) - 1n;

/** A task id: a decimal string or a BigInt (ids exceed 2^53: never a Number). */
export type TaskId = string | bigint;
/** A task by id, or by key. */
export type TaskRef = TaskId | { key: string };

export type Priority = "critical" | "high" | "normal" | "low";
export type TaskStatus = "blocked" | "scheduled" | "ready" | "running" | "retrying" | "succeeded" | "failed"
  | "dead_lettered" | "cancelled" | "skipped" | "missed" | "shed";
export const STATUSES: readonly TaskStatus[] = ["blocked", "scheduled", "ready", "running", "retrying", "succeeded",
  "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"];
export const TERMINAL: readonly TaskStatus[] = ["succeeded", "failed", "dead_lettered", "cancelled", "skipped",
  "missed", "shed"];

/** A uint64 id in the decimal form the wire takes. */
export function idString(value: TaskId, field = "id"): Int64 {
  let parsed: bigint;
  if (typeof value === "bigint") {
    parsed = value;
  } else if (typeof value === "string" && /^[0-9]+$/.test(value)) {
    parsed = BigInt(value);
  } else {
    throw new TypeError(`${field} must be a decimal string or a BigInt (ids exceed 2^53: never a Number), got `
      + `${typeof value === "string" ? JSON.stringify(value) : typeof value}`);
  }
  if (parsed < 0n || parsed > UINT64_MAX) {
    throw new RangeError(`${field} must be between 0 and 2^64-1, got ${parsed}`);
  }
  return parsed.toString();
}

export function refMessage(ref: TaskRef): TaskRefMessage {
  if (typeof ref === "object" && ref !== null && typeof (ref as { key?: unknown }).key === "string") {
    return { key: (ref as { key: string }).key };
  }
  return { id: idString(ref as TaskId, "a task id") };
}

/** bytes as they are, a string as UTF-8 text, anything else as JSON. */
export function encode(value: unknown, contentType?: string | null): [Buffer, string] {
  if (Buffer.isBuffer(value)) {
    return [value, contentType || OCTETS];
  }
  if (value instanceof Uint8Array) {
    return [Buffer.from(value.buffer, value.byteOffset, value.byteLength), contentType || OCTETS];
  }
  if (typeof value === "string") {
    return [Buffer.from(value, "utf8"), contentType || TEXT];
  }
  let text: string | undefined;
  try {
    text = JSON.stringify(value === undefined ? null : value, (_key, item: unknown) => {
      if (typeof item === "bigint") {
        return item.toString();
      }
      if (typeof item === "number" && !Number.isFinite(item)) {
        throw new TypeError(`${item} is not a JSON number`);
      }
      return item;
    });
  } catch (error) {
    throw new TypeError(`cannot send it as JSON: ${(error as Error).message} (pass a Buffer or a string instead)`);
  }
  if (text === undefined) {
    throw new TypeError(`cannot send a ${typeof value} as JSON (pass a Buffer or a string instead)`);
  }
  return [Buffer.from(text, "utf8"), contentType || JSON_TYPE];
}

/** What `encode` made: JSON parsed, text as a string, anything else a Buffer. */
export function decode(data: Buffer, contentType: string): unknown {
  const kind = contentType.split(";", 1)[0]!.trim().toLowerCase();
  if (kind === "application/json" || kind.endsWith("+json")) {
    return JSON.parse(data.toString("utf8"));
  }
  if (kind.startsWith("text/")) {
    return data.toString("utf8");
  }
  return data;
}

/** A failure message fit for the server: NUL replaced, 8 KiB at most. */
export function cleanMessage(text: string): string {
  let message = text.includes("\0") ? text.replaceAll("\0", "\ufffd") : text;
  if (message.length > MAX_MESSAGE) {
    message = message.slice(0, MAX_MESSAGE - 1) + "\u2026";
  }
  return message;
}

/** Unix nanoseconds (a decimal string) as a Date, or null for none. */
export function dateOf(ns: Int64 | null | undefined): Date | null {
  if (ns === null || ns === undefined || ns === "0") {
    return null;
  }
  return new Date(Number(BigInt(ns) / 1_000_000n));
}

function unixNs(value: Date | number, field: string): Int64 {
  const ms = value instanceof Date ? value.getTime() : value * 1000;
  if (!Number.isFinite(ms)) {
    throw new RangeError(`${field} must be a Date or Unix seconds, got ${String(value)}`);
  }
  return (BigInt(Math.round(ms)) * 1_000_000n).toString();
}

function seconds(value: number, field: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`${field} must be a number of seconds >= 0, got ${String(value)}`);
  }
  return value;
}

/** A checkpoint a stage saved, its data decoded by its content type. */
export interface Checkpoint {
  stage: string;
  data: unknown;
  contentType: string;
  attempt: number;
  saved: Date | null;
  size: number;
}

export function checkpointFrom(m: StageCheckpointMessage): Checkpoint {
  return {
    stage: m.stage,
    data: decode(m.data, m.content_type),
    contentType: m.content_type,
    attempt: m.attempt,
    saved: dateOf(m.saved_unix_ns),
    size: m.data.length,
  };
}

const PRIORITIES: Record<Priority, string> = {
  critical: "PRIORITY_CRITICAL", high: "PRIORITY_HIGH", normal: "PRIORITY_NORMAL", low: "PRIORITY_LOW",
};
const CONDITIONS = { success: "EDGE_COND_ON_SUCCESS", failure: "EDGE_COND_ON_FAILURE",
  complete: "EDGE_COND_ON_COMPLETE" } as const;
const MISS = { run_late: "MISS_POLICY_RUN_LATE", skip: "MISS_POLICY_SKIP", fail: "MISS_POLICY_FAIL" } as const;

export function priorityName(wire: string): Priority {
  const name = wire.replace(/^PRIORITY_/, "").toLowerCase();
  return name === "critical" || name === "high" || name === "low" ? name : "normal";
}

export function conditionName(wire: string): "success" | "failure" | "complete" {
  if (wire === CONDITIONS.failure) {
    return "failure";
  }
  return wire === CONDITIONS.complete ? "complete" : "success";
}

export function statusName(wire: string): TaskStatus {
  return wire.replace(/^TASK_STATUS_/, "").toLowerCase() as TaskStatus;
}

export function statusWire(status: TaskStatus): string {
  if (!STATUSES.includes(status)) {
    throw new RangeError(`unknown status ${JSON.stringify(status)}; statuses are ${STATUSES.join(", ")}`);
  }
  return "TASK_STATUS_" + status.toUpperCase();
}

export interface RetryPolicy {
  /** Attempts in all (0: 3). */
  maxAttempts?: number;
  initialBackoff?: number;
  multiplier?: number;
  maxBackoff?: number;
  jitter?: boolean;
}

export interface Dependency {
  ref: TaskRef;
  on?: "success" | "failure" | "complete";
}

/** The options of a task (those of the gRPC TaskSpec; times in seconds). */
export interface TaskOptions {
  contentType?: string;
  pool?: string;
  kind?: string;
  priority?: Priority;
  key?: string;
  tenant?: string;
  /** A soft deadline, seconds from now. */
  deadlineIn?: number;
  /** A soft deadline, as a Date or Unix seconds. */
  deadlineAt?: Date | number;
  /** A fixed start, seconds from now. */
  startIn?: number;
  startAt?: Date | number;
  /** How late a fixed start may still begin. */
  tolerance?: number;
  onMiss?: "run_late" | "skip" | "fail";
  /** The time limit of each attempt, enforced by the server. */
  timeout?: number;
  durationHint?: number;
  retry?: RetryPolicy;
  resources?: Record<string, number>;
  /** Tasks that must succeed first. */
  after?: TaskRef | TaskRef[];
  deps?: Dependency[];
  tags?: Record<string, string>;
  /** Labels a worker must carry to run it. */
  labels?: Record<string, string>;
  /** Its pipeline stages, in order (checkpoints). */
  stages?: string[];
}

function isRef(value: unknown): value is TaskRef {
  return typeof value === "string" || typeof value === "bigint"
    || (typeof value === "object" && value !== null && !Array.isArray(value)
      && typeof (value as { key?: unknown }).key === "string");
}

/** A TaskSpec message from a payload and task options. */
export function taskMessage(payload: unknown, options: TaskOptions = {}): TaskSpecMessage {
  const spec: TaskSpecMessage = {};
  if (payload !== undefined || options.contentType) {
    [spec.payload, spec.content_type] = encode(payload, options.contentType);
  }
  if (options.pool !== undefined) spec.pool = options.pool;
  if (options.kind !== undefined) spec.kind = options.kind;
  if (options.priority !== undefined) {
    const priority = PRIORITIES[options.priority];
    if (priority === undefined) {
      throw new RangeError(`priority must be one of ${Object.keys(PRIORITIES).join(", ")}, got ${options.priority}`);
    }
    spec.priority = priority;
  }
  if (options.key !== undefined) spec.key = options.key;
  if (options.tenant !== undefined) spec.tenant = options.tenant;
  if (options.deadlineIn !== undefined) spec.deadline_in_s = seconds(options.deadlineIn, "deadlineIn");
  if (options.deadlineAt !== undefined) spec.deadline_unix_ns = unixNs(options.deadlineAt, "deadlineAt");
  if (options.startIn !== undefined) spec.start_in_s = seconds(options.startIn, "startIn");
  if (options.startAt !== undefined) spec.start_unix_ns = unixNs(options.startAt, "startAt");
  if (options.tolerance !== undefined) spec.tolerance_s = seconds(options.tolerance, "tolerance");
  if (options.onMiss !== undefined) {
    const miss = MISS[options.onMiss];
    if (miss === undefined) {
      throw new RangeError(`onMiss must be one of ${Object.keys(MISS).join(", ")}, got ${options.onMiss}`);
    }
    spec.on_miss = miss;
  }
  if (options.timeout !== undefined) spec.timeout_s = seconds(options.timeout, "timeout");
  if (options.durationHint !== undefined) spec.duration_hint_s = seconds(options.durationHint, "durationHint");
  if (options.retry !== undefined) {
    const r = options.retry;
    spec.retry = {
      max_attempts: r.maxAttempts ?? 0,
      ...(r.initialBackoff !== undefined && { initial_backoff_s: seconds(r.initialBackoff, "retry.initialBackoff") }),
      ...(r.multiplier !== undefined && { multiplier: r.multiplier }),
      ...(r.maxBackoff !== undefined && { max_backoff_s: seconds(r.maxBackoff, "retry.maxBackoff") }),
      ...(r.jitter !== undefined && { jitter: r.jitter }),
    };
  }
  if (options.resources !== undefined) spec.resources = { ...options.resources };
  if (options.after !== undefined) {
    const refs = isRef(options.after) ? [options.after] : options.after;
    spec.after = refs.map(refMessage);
  }
  if (options.deps !== undefined) {
    spec.deps = options.deps.map((dep): DepMessage => {
      const cond = CONDITIONS[dep.on ?? "success"];
      if (cond === undefined) {
        throw new RangeError(`a dependency's "on" must be success, failure or complete, got ${dep.on}`);
      }
      return { ref: refMessage(dep.ref), cond };
    });
  }
  if (options.tags !== undefined) spec.tags = { ...options.tags };
  if (options.labels !== undefined) spec.labels = { ...options.labels };
  if (options.stages !== undefined) {
    if (!Array.isArray(options.stages)) {
      throw new TypeError("stages must be an array of stage names");
    }
    spec.stages = [...options.stages];
  }
  return spec;
}

/** TLS settings: true for the system's roots, or PEM contents for a private
 * CA (`ca`) and a client certificate (`cert`, `key`: mTLS). */
export type TlsOptions = boolean | { ca?: Buffer | string; cert?: Buffer | string; key?: Buffer | string };

function pem(value: Buffer | string | undefined): Buffer | null {
  return value === undefined ? null : Buffer.isBuffer(value) ? value : Buffer.from(value);
}

/** The address and credentials for `target` (host:port, or an http:// or https:// URL). */
export function endpoint(target: string, tls: TlsOptions | undefined): { address: string; credentials: grpc.ChannelCredentials } {
  let secure = tls !== undefined && tls !== false;
  let address = target;
  if (address.startsWith("https://")) {
    address = address.slice("https://".length);
    secure = true;
  } else if (address.startsWith("http://")) {
    if (secure) {
      throw new Error("TLS settings need an https:// target (or a plain host:port); refusing to connect in plaintext");
    }
    address = address.slice("http://".length);
  }
  address = address.replace(/\/+$/, "");
  if (!secure) {
    return { address, credentials: grpc.credentials.createInsecure() };
  }
  const settings = typeof tls === "object" ? tls : {};
  return { address, credentials: grpc.credentials.createSsl(pem(settings.ca), pem(settings.key), pem(settings.cert)) };
}

export const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.max_receive_message_length": 256 * 1024 * 1024,
  "grpc.max_send_message_length": 256 * 1024 * 1024,
  "grpc.keepalive_time_ms": 20_000,
  "grpc.keepalive_timeout_ms": 20_000,
  "grpc.keepalive_permit_without_calls": 1,
};

export function bearer(token: string | undefined): grpc.Metadata {
  const metadata = new grpc.Metadata();
  if (token) {
    metadata.set("authorization", `Bearer ${token}`);
  }
  return metadata;
}

export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  return bare === "localhost" || bare === "::1" || /^127\.\d+\.\d+\.\d+$/.test(bare);
}
