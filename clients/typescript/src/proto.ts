// The cronoq.v1 services, loaded from the shipped proto/cronoq.proto at run
// time. 64-bit integers arrive as decimal strings (they exceed 2^53), enums
// as their names, bytes as Buffers; field names keep the proto's snake_case.
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";

export const PROTOCOL_VERSION = 3;

/** A uint64 or int64 as the loader hands it over (and accepts). */
export type Int64 = string;

export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

const PROTO_PATH = fileURLToPath(new URL("../proto/cronoq.proto", import.meta.url));

interface CronoqPackage {
  cronoq: { v1: Record<"Tasks" | "Workers" | "Admin", grpc.ServiceClientConstructor> };
}

let services: CronoqPackage["cronoq"]["v1"] | undefined;

/** The Tasks, Workers and Admin client constructors (loaded once). */
export function serviceConstructors(): CronoqPackage["cronoq"]["v1"] {
  if (services === undefined) {
    const definition = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
    const loaded = grpc.loadPackageDefinition(definition) as unknown as CronoqPackage;
    services = loaded.cronoq.v1;
  }
  return services;
}

// ---------------------------------------------------------------- messages
// The fields this package reads and writes, as the loader represents them.

export interface StageCheckpointMessage {
  stage: string;
  data: Buffer;
  content_type: string;
  attempt: number;
  saved_unix_ns: Int64;
}

export interface LeaseMessage {
  lease: Int64;
  task_id: Int64;
  attempt: number;
  pool: string;
  payload: Buffer;
  content_type: string;
  kind: string;
  key: string;
  tags: Record<string, string>;
  timeout_s?: number | null;
  deadline_unix_ns?: Int64 | null;
  priority: string;
  tenant: string;
  labels: Record<string, string>;
  stages: string[];
  checkpoints: StageCheckpointMessage[];
}

export interface RegisteredMessage {
  worker_id: Int64;
  lease_ttl_s: number;
  slots: number;
  protocol_version: number;
  max_message_bytes: number;
  checkpoints: boolean;
}

export interface ServerMessage {
  msg?: "registered" | "lease" | "abort" | "shutdown" | "slots_granted" | "batch" | "checkpoint_saved";
  registered?: RegisteredMessage;
  lease?: LeaseMessage;
  abort?: { lease: Int64; reason: string; code: string };
  shutdown?: { reason: string; not_leader: boolean };
  slots_granted?: { slots: number };
  batch?: { messages: ServerMessage[] };
  checkpoint_saved?: { lease: Int64; stage: string; seq: Int64; error: string };
}

export interface WorkerMessage {
  register?: {
    pool: string;
    slots: number;
    worker_name: string;
    protocol_version: number;
    labels: Record<string, string>;
    accept_batches: boolean;
    accept_checkpoints: boolean;
  };
  heartbeat?: { lease: Int64 };
  complete?: { lease: Int64; output: Buffer; content_type: string };
  fail?: { lease: Int64; message: string; permanent: boolean; retry_after_s?: number };
  nack?: { lease: Int64; reason: string };
  cancelled?: { lease: Int64; message: string };
  set_slots?: { slots: number };
  checkpoint?: { lease: Int64; stage: string; data: Buffer; content_type: string; seq: Int64 };
  batch?: { messages: WorkerMessage[] };
}

export interface TaskRefMessage {
  id?: Int64;
  key?: string;
  ref?: "id" | "key";
}

export interface DepMessage {
  ref: TaskRefMessage;
  cond: string;
}

export interface TaskSpecMessage {
  payload?: Buffer;
  content_type?: string;
  pool?: string;
  kind?: string;
  priority?: string;
  key?: string;
  tenant?: string;
  deadline_in_s?: number;
  deadline_unix_ns?: Int64;
  start_in_s?: number;
  start_unix_ns?: Int64;
  tolerance_s?: number;
  on_miss?: string;
  timeout_s?: number;
  duration_hint_s?: number;
  retry?: {
    max_attempts?: number;
    initial_backoff_s?: number;
    multiplier?: number;
    max_backoff_s?: number;
    jitter?: boolean;
  };
  resources?: Record<string, number>;
  after?: TaskRefMessage[];
  deps?: DepMessage[];
  tags?: Record<string, string>;
  labels?: Record<string, string>;
  stages?: string[];
}

export interface TaskResultMessage {
  id: Int64;
  status: string;
  output: Buffer;
  content_type: string;
  message: string;
  output_available: boolean;
}

export interface SubmitResponseMessage {
  id: Int64;
  duplicate: boolean;
  result?: TaskResultMessage | null;
}

export interface AttemptMessage {
  attempt: number;
  status: string;
  message: string;
  started_unix_ns: Int64;
  ended_unix_ns?: Int64 | null;
}

export interface TaskInfoMessage {
  id: Int64;
  status: string;
  pool: string;
  key: string;
  kind: string;
  attempt: number;
  max_attempts: number;
  message: string;
  output_available: boolean;
  created_unix_ns?: Int64 | null;
  started_unix_ns?: Int64 | null;
  finished_unix_ns?: Int64 | null;
  priority: string;
  tenant: string;
  tags: Record<string, string>;
  deps: DepMessage[];
  attempts: AttemptMessage[];
  stages: string[];
  checkpoints: StageCheckpointMessage[];
  labels: Record<string, string>;
}

export interface ListTasksResponseMessage {
  tasks: TaskInfoMessage[];
  next_after: Int64;
  unavailable_shards: string[];
}

export interface StatusEventMessage {
  id: Int64;
  pool: string;
  key: string;
  status: string;
  attempt: number;
  at_unix_ns: Int64;
  message: string;
  stage: string;
  max_attempts: number;
}

export interface WorkerInfoMessage {
  id: Int64;
  name: string;
  pool: string;
  labels: Record<string, string>;
  slots: number;
  busy: number;
  connected_unix_ns: Int64;
  health: string;
  lease_expiries: Int64;
  last_seen_unix_ns: Int64;
}
