// WebClient: submit and follow tasks from a browser page over gRPC-Web
// (cronoq-server's [server.grpc_web], served on its HTTP listener). Only
// fetch, TextEncoder and protobufjs: nothing of Node's own, so a bundler
// can ship it to a page. Task ids are decimal strings (they exceed 2^53).
import protobuf from "protobufjs/light.js";
import { DESCRIPTOR } from "./descriptor.generated.js";

const root = protobuf.Root.fromJSON(DESCRIPTOR);
const type = (name: string): protobuf.Type => root.lookupType(`cronoq.v1.${name}`);
const CONVERT: protobuf.IConversionOptions = { longs: String, enums: String, bytes: Array, defaults: true,
  oneofs: true };
const MEDIA = "application/grpc-web+proto";

export type WebTaskStatus = "blocked" | "scheduled" | "ready" | "running" | "retrying" | "succeeded" | "failed"
  | "dead_lettered" | "cancelled" | "skipped" | "missed";
/** A task by id (a decimal string or a BigInt) or by key. */
export type WebTaskRef = string | bigint | { key: string };

export interface WebClientOptions {
  /** A client token, sent as "authorization: Bearer <token>". */
  token?: string;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
}

export interface WebSubmitOptions {
  pool?: string;
  kind?: string;
  key?: string;
  priority?: "low" | "normal" | "high" | "critical";
  tenant?: string;
  tags?: Record<string, string>;
  deadlineIn?: number;
}

export interface WebTaskInfo {
  id: string;
  status: WebTaskStatus;
  pool: string;
  key: string | null;
  kind: string;
  attempt: number;
}

export interface WebResult {
  id: string;
  status: WebTaskStatus;
  /** The output's bytes, when it succeeded and the server keeps them. */
  output: Uint8Array | null;
  contentType: string;
  message: string | null;
  /** The output parsed as JSON (null without output). */
  json<T = unknown>(): T | null;
}

export interface WebStatusEvent {
  id: string;
  pool: string;
  key: string | null;
  status: WebTaskStatus;
  attempt: number;
  at: Date;
  message: string | null;
}

/** A call refused by the server: `code` is the gRPC status name, `kind` the cronoq error. */
export class WebServerError extends Error {
  constructor(readonly code: string, message: string, readonly kind: string | null) {
    super(`${code}: ${message}`);
    this.name = "WebServerError";
  }
}

const CODES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
  "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"];

function statusName(wire: string): WebTaskStatus {
  return wire.replace(/^TASK_STATUS_/, "").toLowerCase() as WebTaskStatus;
}

function refOf(ref: WebTaskRef): Record<string, unknown> {
  if (typeof ref === "object") return { key: ref.key };
  const id = String(ref);
  if (!/^[0-9]{1,20}$/.test(id) || BigInt(id) >= 2n ** 64n) {
    throw new RangeError(`a task id is a decimal uint64, got ${JSON.stringify(id)}`);
  }
  return { id };
}

function frame(data: Uint8Array): Uint8Array {
  const out = new Uint8Array(5 + data.length);
  new DataView(out.buffer).setUint32(1, data.length);
  out.set(data, 5);
  return out;
}

/** The fields of a trailers frame or of trailers-only headers. */
function fields(text: string): Map<string, string> {
  const found = new Map<string, string>();
  for (const line of text.split("\r\n")) {
    const at = line.indexOf(":");
    if (at > 0) found.set(line.slice(0, at).trim().toLowerCase(), line.slice(at + 1).trim());
  }
  return found;
}

function check(status: Map<string, string>): void {
  const code = Number(status.get("grpc-status") ?? "2");
  if (code !== 0) {
    throw new WebServerError(CODES[code] ?? `STATUS_${code}`, decodeURIComponent(status.get("grpc-message") ?? ""),
      status.get("cronoq-error") ?? null);
  }
}

/** Splits a byte stream into gRPC-Web frames as they complete. */
class Frames {
  private buffer = new Uint8Array(0);

  push(chunk: Uint8Array): Array<{ trailers: boolean; data: Uint8Array }> {
    const joined = new Uint8Array(this.buffer.length + chunk.length);
    joined.set(this.buffer);
    joined.set(chunk, this.buffer.length);
    const out: Array<{ trailers: boolean; data: Uint8Array }> = [];
    let at = 0;
    while (joined.length - at >= 5) {
      const length = new DataView(joined.buffer, at + 1, 4).getUint32(0);
      if (joined.length - at - 5 < length) break;
      out.push({ trailers: (joined[at]! & 0x80) !== 0, data: joined.slice(at + 5, at + 5 + length) });
      at += 5 + length;
    }
    this.buffer = joined.slice(at);
    return out;
  }

  get leftover(): number {
    return this.buffer.length;
  }
}

export class WebClient {
  private readonly base: string;
  private readonly fetcher: typeof fetch;

  /** `baseUrl`: the server's HTTP listener, e.g. "https://cronoq.example:7071". */
  constructor(baseUrl: string, private readonly options: WebClientOptions = {}) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  private post(method: string, request: string, message: Record<string, unknown>, signal?: AbortSignal
  ): Promise<Response> {
    const headers: Record<string, string> = { "content-type": MEDIA, "x-grpc-web": "1" };
    if (this.options.token) headers.authorization = `Bearer ${this.options.token}`;
    const requestType = type(request);
    const bytes = requestType.encode(requestType.fromObject(message)).finish();
    return this.fetcher(`${this.base}/cronoq.v1.${method}`, { method: "POST", headers, body: frame(bytes), signal });
  }

  private async unary(method: string, request: string, answer: string, message: Record<string, unknown>
  ): Promise<Record<string, unknown>> {
    const response = await this.post(method, request, message);
    if (response.status !== 200) {
      throw new WebServerError("UNKNOWN", `HTTP ${response.status}: ${(await response.text()).trim()}`, null);
    }
    const headerStatus = new Map<string, string>();
    response.headers.forEach((value, name) => headerStatus.set(name.toLowerCase(), value));
    const frames = new Frames().push(new Uint8Array(await response.arrayBuffer()));
    const trailers = frames.find((f) => f.trailers);
    check(trailers ? fields(new TextDecoder("latin1").decode(trailers.data)) : headerStatus);
    const data = frames.find((f) => !f.trailers);
    if (data === undefined) throw new WebServerError("INTERNAL", "the answer holds no message", null);
    const answerType = type(answer);
    return answerType.toObject(answerType.decode(data.data), CONVERT);
  }

  /** Submits a task; a string payload is sent as text, anything else as JSON. */
  async submit(payload: unknown, options: WebSubmitOptions = {}): Promise<{ id: string; duplicate: boolean }> {
    const text = typeof payload === "string";
    const task: Record<string, unknown> = {
      payload: new TextEncoder().encode(text ? payload : JSON.stringify(payload)),
      content_type: text ? "text/plain; charset=utf-8" : "application/json",
      pool: options.pool ?? "", kind: options.kind ?? "", key: options.key ?? "", tenant: options.tenant ?? "",
      tags: options.tags ?? {},
      priority: `PRIORITY_${(options.priority ?? "normal").toUpperCase()}`,
    };
    if (options.deadlineIn !== undefined) task.deadline_in_s = options.deadlineIn;
    const answer = await this.unary("Tasks/Submit", "SubmitRequest", "SubmitResponse", { task });
    return { id: String(answer.id), duplicate: Boolean(answer.duplicate) };
  }

  async get(ref: WebTaskRef): Promise<WebTaskInfo> {
    const m = await this.unary("Tasks/Get", "GetRequest", "TaskInfo", { task: refOf(ref) });
    return { id: String(m.id), status: statusName(String(m.status)), pool: String(m.pool), key: String(m.key) || null,
      kind: String(m.kind), attempt: Number(m.attempt ?? 0) };
  }

  /** Waits until the task finished (at most `timeout` seconds: DEADLINE_EXCEEDED after). */
  async wait(ref: WebTaskRef, options: { timeout?: number } = {}): Promise<WebResult> {
    const message: Record<string, unknown> = { task: refOf(ref) };
    if (options.timeout !== undefined) message.timeout_s = options.timeout;
    const m = await this.unary("Tasks/Wait", "WaitRequest", "TaskResult", message);
    const output = m.output_available ? Uint8Array.from(m.output as number[]) : null;
    return {
      id: String(m.id), status: statusName(String(m.status)), output, contentType: String(m.content_type),
      message: String(m.message) || null,
      json<T>(): T | null {
        return output === null ? null : JSON.parse(new TextDecoder().decode(output)) as T;
      },
    };
  }

  /** Cancels a task: false when it had already finished. */
  async cancel(ref: WebTaskRef): Promise<boolean> {
    const m = await this.unary("Tasks/Cancel", "CancelRequest", "CancelResponse", { task: refOf(ref) });
    return Boolean(m.cancelled);
  }

  /** The status changes of `pools` (every pool the token may use when empty) as they happen, until `signal`
   * aborts or the server ends the stream (a refusal rejects with a WebServerError). */
  async *watch(options: { pools?: string[]; terminalOnly?: boolean; signal?: AbortSignal } = {}
  ): AsyncGenerator<WebStatusEvent> {
    const response = await this.post("Tasks/Watch", "WatchRequest",
      { pools: options.pools ?? [], terminal_only: options.terminalOnly ?? false }, options.signal);
    if (response.status !== 200 || response.body === null) {
      throw new WebServerError("UNKNOWN", `HTTP ${response.status}: ${(await response.text()).trim()}`, null);
    }
    if (response.headers.get("grpc-status") !== null) {
      const status = new Map<string, string>();
      response.headers.forEach((value, name) => status.set(name.toLowerCase(), value));
      check(status);
      return;
    }
    const eventType = type("StatusEvent");
    const frames = new Frames();
    const reader = response.body.getReader();
    try {
      for (;;) {
        let chunk: Awaited<ReturnType<typeof reader.read>>;
        try {
          chunk = await reader.read();
        } catch (error) {
          if (options.signal?.aborted) return;
          throw error;
        }
        if (chunk.done) {
          throw new WebServerError("UNAVAILABLE", `the stream ended without a status (${frames.leftover} bytes left)`,
            null);
        }
        for (const f of frames.push(chunk.value)) {
          if (f.trailers) {
            check(fields(new TextDecoder("latin1").decode(f.data)));
            return;
          }
          const m = eventType.toObject(eventType.decode(f.data), CONVERT);
          yield { id: String(m.id), pool: String(m.pool), key: String(m.key) || null,
            status: statusName(String(m.status)), attempt: Number(m.attempt), message: String(m.message) || null,
            at: new Date(Number(BigInt(String(m.at_unix_ns)) / 1_000_000n)) };
        }
      }
    } finally {
      reader.releaseLock();
      await response.body.cancel().catch(() => undefined);
    }
  }
}
