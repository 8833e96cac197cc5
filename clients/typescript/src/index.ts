// @cronoq/client: the Node client and worker of cronoq-server.
export { Client, TaskResult } from "./client.js";
export type { AttemptInfo, BatchTask, ClientOptions, StatusEvent, SubmitOptions, Submission, TaskInfo, TaskPage,
  WorkerInfo } from "./client.js";
export { Lease, runWorker } from "./worker.js";
export type { AbortReason, Handler, WorkerLogger, WorkerOptions } from "./worker.js";
export { Cancelled, CheckpointError, CronoqError, Permanent, Reject, Retryable, ServerError } from "./errors.js";
export { PROTOCOL_VERSION } from "./proto.js";
export { STATUSES, TERMINAL, decode, encode } from "./wire.js";
export type { Checkpoint, Dependency, Priority, RetryPolicy, TaskId, TaskOptions, TaskRef, TaskStatus,
  TlsOptions } from "./wire.js";
