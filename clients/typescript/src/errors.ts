// What a handler throws to decide an attempt, and the errors this package raises.
import * as grpc from "@grpc/grpc-js";

const MAX_RETRY_AFTER_S = 100 * 365 * 86400;

/** Base class of this package's errors. */
export class CronoqError extends Error {
  override name = "CronoqError";
}

/** Thrown by a handler: the attempt failed and may be retried; `retryAfter`
 * (seconds) makes the next attempt wait at least that long. */
export class Retryable extends CronoqError {
  override name = "Retryable";
  readonly retryAfter: number | null;

  constructor(message = "", options: { retryAfter?: number } = {}) {
    super(message);
    const after = options.retryAfter;
    if (after !== undefined && (typeof after !== "number" || !Number.isFinite(after) || after > MAX_RETRY_AFTER_S)) {
      throw new RangeError(`retryAfter must be a finite number of seconds up to ${MAX_RETRY_AFTER_S}, got ${after}`);
    }
    this.retryAfter = after === undefined ? null : Math.max(0, after);
  }
}

/** Thrown by a handler: the attempt failed and retrying cannot help. */
export class Permanent extends CronoqError {
  override name = "Permanent";
}

/** Thrown by a handler: give the lease back unrun (Nack). The server offers
 * it to another worker of the pool without using an attempt, or fails the
 * attempt as retryable if none has a free slot. */
export class Reject extends CronoqError {
  override name = "Reject";
  get reason(): string {
    return this.message;
  }
}

/** Thrown by a handler: end the task as cancelled (no retry). */
export class Cancelled extends CronoqError {
  override name = "Cancelled";
}

/** The server refused a checkpoint (`message` says why); nothing was saved. */
export class CheckpointError extends CronoqError {
  override name = "CheckpointError";
}

/** A call the server refused: `code` is the gRPC status name
 * ("NOT_FOUND", "UNAVAILABLE", ...), `kind` the cronoq error it stands for
 * (the `cronoq-error` trailing metadata: "UnknownTask", "QueueFull", ...),
 * or null. */
export class ServerError extends CronoqError {
  override name = "ServerError";
  readonly code: string;
  readonly kind: string | null;

  constructor(code: string, message: string, kind: string | null = null) {
    super(message);
    this.code = code;
    this.kind = kind;
  }
}

export function isServiceError(error: unknown): error is grpc.ServiceError {
  return error instanceof Error && typeof (error as grpc.ServiceError).code === "number"
    && (error as grpc.ServiceError).metadata instanceof grpc.Metadata;
}

export function statusName(code: number): string {
  return grpc.status[code] ?? String(code);
}

export function metadataValue(metadata: grpc.Metadata | undefined, key: string): string | null {
  const values = metadata?.get(key) ?? [];
  for (const value of values) {
    if (typeof value === "string") {
      return value;
    }
  }
  return null;
}

/** The ServerError a failed call stands for. */
export function errorFrom(error: grpc.ServiceError): ServerError {
  const code = statusName(error.code);
  return new ServerError(code, error.details || code, metadataValue(error.metadata, "cronoq-error"));
}
