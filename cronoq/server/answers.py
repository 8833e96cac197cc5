"""The answers of the HTTP/JSON gateway, described for the OpenAPI document
(``openapi.py``): the gateway writes them with ``cronoq._proto.json_view``,
and tests/test_server_openapi.py holds every live answer to these schemas."""

from __future__ import annotations

from typing import Any

from ..core.explain import REASONS
from ..core.options import OVERLAP_POLICIES
from ..core.snapshot import POOL_FIELDS
from ..core.types import STATUSES as _ALL_STATUSES
from ..core.types import TERMINAL
from .schema import (
    CONDITION_NAMES, PRIORITIES, AnyJson, Array, Base64, Choice, Field, Flag, Id, Integer, Map, Number, Obj, Seconds,
    Text, UnixNs,
)

__all__ = ["STATUSES", "TERMINAL_STATUSES", "RESULT", "SUBMITTED", "SUBMIT_OUT", "BATCH_OUT", "INFO", "TASKS_OUT",
           "CANCEL_OUT", "REMOVED_OUT", "EXPLANATION", "DEPENDENT", "DEPENDENTS_OUT", "WORKER", "WORKERS_OUT", "SCHEDULE",
           "SCHEDULES_OUT", "POOL", "SNAPSHOT", "ENVIRONMENT", "ENVIRONMENTS_OUT", "TIMELINE", "HISTORY", "ERROR",
           "BULK_CANCEL_OUT", "BULK_RESUBMIT_OUT"]

STATUSES = tuple(str(status) for status in _ALL_STATUSES)
TERMINAL_STATUSES = tuple(status for status in STATUSES if status in TERMINAL)
OVERLAPS = OVERLAP_POLICIES


RESULT = Obj("TaskResult", {
    "id": Id("The task."),
    "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (looked up by key, present only when one was missing)."),
    "status": Choice(TERMINAL_STATUSES, "How it ended."),
    "output_available": Flag("Whether the output is still kept (succeeded tasks only)."),
    "content_type": Text("The output's content type (with the output)."),
    "output": AnyJson("The output as JSON, when its content type is JSON (application/json or +json) "
                      "and it parses."),
    "output_text": Text("The output as text, when its content type is text/* and it is UTF-8."),
    "output_b64": Base64("The output's bytes, base64 (whenever output_available, except a truncated "
                         "JSON or text output, given as output_text)."),
    "output_size": Integer("With max_bytes: the whole output's size in bytes."),
    "output_truncated": Flag("With max_bytes: whether only the output's first max_bytes are given."),
    "message": Text("Why it failed, was cancelled or skipped."),
}, "The result of a finished task.", required=("id", "status", "output_available"))

SUBMITTED = Obj("Submitted", {
    "id": Id("The task (the existing one when duplicate)."),
    "duplicate": Flag("The key named a task that already existed: nothing new was enqueued."),
}, "A task of a batch, admitted.", required=("id", "duplicate"))

SUBMIT_OUT = Obj("SubmitResponse", {
    **SUBMITTED.fields,
    "result": RESULT,
}, "The task admitted, and its result when the request waited.", required=("id", "duplicate"))

BATCH_OUT = Obj("SubmitBatchResponse", {
    "tasks": Array(SUBMITTED, "In request order."),
}, "The tasks of a batch, admitted.", required=("tasks",))

DEP_OUT = Obj("TaskDependency", {
    "id": Id("The task depended on, by id."),
    "key": Text("The task depended on, by key."),
    "cond": Choice(CONDITION_NAMES, "When the dependent may run."),
}, "A dependency as submitted: an id or a key, and its condition.", required=("cond",))

ATTEMPT = Obj("Attempt", {
    "attempt": Integer("Its number, from 1.", maximum=2 ** 32 - 1),
    "status": Choice(STATUSES, "How it ended (retrying, succeeded, failed...); absent while it runs, or when "
                               "it ended without a status of its own (a lease handed to another worker)."),
    "message": Text("Why it failed, when it did."),
    "started_unix_ns": UnixNs("When it started."),
    "ended_unix_ns": UnixNs("When it ended; absent while it runs."),
    "traceback": Text("The traceback the worker sent with its failure (its last 8 KiB; the leader's memory "
                      "only: the task's lookup, not listings)."),
    "worker_id": Id("The worker that got its lease (an id of /v1/workers); absent when not known."),
    "worker_name": Text("That worker's registered name (with worker_id)."),
}, "One attempt of a task.", required=("attempt", "started_unix_ns"))

STAGE_CHECKPOINT = Obj("StageCheckpoint", {
    "stage": Text("The stage."),
    "content_type": Text("The data's content type."),
    "data": AnyJson("The data as JSON, when its content type is JSON and it parses."),
    "data_text": Text("The data as text, when its content type is text/* and it is UTF-8."),
    "data_b64": Base64("The data's bytes, base64."),
    "attempt": Integer("The attempt that saved it.", maximum=2 ** 32 - 1),
    "saved_unix_ns": UnixNs("When it was saved."),
}, "The checkpoint of one stage.", required=("stage", "data_b64", "attempt", "saved_unix_ns"))

INFO = Obj("TaskInfo", {
    "id": Id("The task."),
    "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (looked up by key, present only when one was missing)."),
    "status": Choice(STATUSES, "Its status now (authoritative)."),
    "pool": Text("Its pool."),
    "key": Text("Its key, if any."),
    "kind": Text("Its kind."),
    "attempt": Integer("The number of the latest attempt (0 before the first).", maximum=2 ** 32 - 1),
    "max_attempts": Integer("Attempts allowed, when known.", maximum=2 ** 32 - 1),
    "priority": Choice(PRIORITIES, "Its priority class, when known."),
    "tenant": Text("Its tenant, if any."),
    "tags": Map(Text(), "Its tags, when known."),
    "labels": Map(Text(), "The worker labels it asked for, when known."),
    "output_available": Flag("It succeeded and its output is kept."),
    "message": Text("Why it failed, was cancelled or skipped."),
    "created_unix_ns": UnixNs("When it was submitted, when known."),
    "started_unix_ns": UnixNs("When its latest attempt started, when known."),
    "finished_unix_ns": UnixNs("When it finished, when known."),
    "deps": Array(DEP_OUT, "What it depends on (after and deps), when known."),
    "attempts": Array(ATTEMPT, "Its attempts the leader saw, oldest first (the latest 32)."),
    "stages": Array(Text(), "Its declared stages, in order."),
    "checkpoints": Array(STAGE_CHECKPOINT, "The checkpoints saved so far, in stage order (the task's own "
                                           "lookup only, not listings)."),
    "payload_content_type": Text("The payload's content type, with the payload preview (the task's lookup "
                                 "only, while the leader's info cache remembers the task)."),
    "payload_text": Text("The payload preview as text, when its content type is JSON or text and it is UTF-8."),
    "payload_b64": Base64("The payload preview's bytes, base64, when it is not given as payload_text."),
    "payload_size": Integer("The whole payload's size in bytes, with the preview."),
    "payload_truncated": Flag("Whether the preview holds only the payload's first outputs.payload_preview_bytes."),
}, "A task's state. id and status are authoritative; the other fields are best effort (the leader's "
   "info cache, or the store).", required=("id", "status", "pool", "attempt", "output_available"))

WAIT_REASON = Obj("WaitReason", {
    "code": Choice(REASONS, "What holds it back (docs/server.md lists each code's detail)."),
    "message": Text("The reason, in a sentence."),
    "detail": Map(AnyJson(), "The reason's figures: which dependencies, labels, resource units, times..."),
}, "One reason a task is not running yet.", required=("code", "message", "detail"))

DEPENDENT = Obj("Dependent", {
    "id": Id("The dependent task."),
    "key": Text("Its key, if any."),
    "status": Choice(STATUSES, "Its status now."),
    "pool": Text("Its pool."),
    "depth": Integer("1: it depends on the task asked about; 2: on a dependent of depth 1; and so on.",
                     minimum=1, maximum=2 ** 32 - 1),
    "depends_on": Array(Id("A task."), "The tasks of this answer it depends on (the one asked about included)."),
    "deps": Array(DEP_OUT, "All its dependencies as submitted, when known."),
}, "A task that depends on the one asked about, directly or through other dependents.",
    required=("id", "status", "pool", "depth", "depends_on"))

DEPENDENTS_OUT = Obj("DependentsResponse", {
    "id": Id("The task asked about."),
    "key": Text("Its key, if any."),
    "status": Choice(STATUSES, "Its status now."),
    "dependents": Array(DEPENDENT, "Nearest first (by depth), then in id order."),
    "truncated": Flag("limit was reached: more dependents exist."),
    "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (looked up by key, "
                                        "present only when one was missing)."),
}, "The tasks that depend on a task, from the leader's engine (tasks that have not ended) and its record of "
   "recent tasks (outputs.info_entries): a dependent the leader no longer remembers is not listed.",
    required=("id", "status", "dependents", "truncated"))

EXPLANATION = Obj("Explanation", {
    "id": Id("The task."),
    "status": Choice(STATUSES, "Its status now."),
    "pool": Text("Its pool."),
    "priority": Choice(PRIORITIES, "Its priority class, when known."),
    "key": Text("Its key, if any."),
    "tenant": Text("Its tenant, if any."),
    "summary": Text("Where it stands, in a sentence or two."),
    "waiting": Flag("Whether something holds it back (reasons is not empty)."),
    "score": Number("Its dispatch score (class base, aging, deadline urgency), while it is ready in its pool's "
                    "queues."),
    "position": Integer("Its place among the pool's queued ready tasks (1: the next to start), while it is "
                        "queued.", maximum=2 ** 32 - 1),
    "queued": Integer("Ready tasks in its pool's queues.", maximum=2 ** 32 - 1),
    "reasons": Array(WAIT_REASON, "Every reason it waits, in a fixed order of codes; empty while it runs or "
                                  "once it ended."),
    "at_unix_ns": UnixNs("The leader's engine time of this answer."),
}, "Why a task waits, from the leader's engine state.",
    required=("id", "status", "pool", "summary", "waiting", "queued", "reasons", "at_unix_ns"))

TASKS_OUT = Obj("TaskList", {
    "tasks": Array(INFO, "In id order (descending with order=newest)."),
    "next_after": Id("Present when more tasks follow: pass it as after for the next page."),
    "next_before": Id("With order=newest, present when older tasks follow: pass it as before for the next page."),
    "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (present only when one was missing)."),
}, "A page of tasks (with shards: of every shard, in id order).", required=("tasks",))

CANCEL_OUT = Obj("CancelResponse", {
    "cancelled": Flag("False when the task had already finished."),
}, "Whether the task was cancelled.", required=("cancelled",))

class _TextOrNull(Text):
    """A string, or null (answers only)."""

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": ["string", "null"]}


_BULK_ERROR = _TextOrNull("Why this task could not be acted on (as the single route's error); null when it was.")

BULK_CANCEL_OUT = Obj("BulkCancelResponse", {
    "results": Array(Obj("BulkCancelResult", {
        "id": Id("The task, when it was named by id."),
        "key": Text("The task, when it was named by key."),
        "cancelled": Flag("Whether this request cancelled it (false when it had finished, or on an error)."),
        "error": _BULK_ERROR,
    }, "What happened to one task.", required=("cancelled", "error")), "Ids first, then keys, in request order."),
}, "One result per task named.", required=("results",))

BULK_RESUBMIT_OUT = Obj("BulkResubmitResponse", {
    "results": Array(Obj("BulkResubmitResult", {
        "id": Id("The dead-lettered task."),
        "new_id": Id("The new task (absent on an error)."),
        "error": _BULK_ERROR,
    }, "What happened to one task.", required=("id", "error")), "In request order."),
}, "One result per task named.", required=("results",))

REMOVED_OUT = Obj("RemoveRecurringResponse", {
    "removed": Flag("False when no schedule of that name existed."),
}, "Whether the schedule was removed.", required=("removed",))

WORKER = Obj("Worker", {
    "id": Id("Assigned by the server, per connection."),
    "name": Text("What the worker registered as."),
    "pool": Text("The pool it serves."),
    "labels": Map(Text(), "Its labels."),
    "slots": Integer("Slots granted.", maximum=2 ** 32 - 1),
    "busy": Integer("Leases running now.", maximum=2 ** 32 - 1),
    "connected_unix_ns": UnixNs("When it connected."),
    "health": Choice(("healthy", "suspect"), "suspect: a lease expired while it sent no message at all; it gets "
                                             "no new lease until it sends one."),
    "lease_expiries": Integer("Its leases that expired, since it connected."),
    "last_seen_unix_ns": UnixNs("Its last message (its Register at first)."),
}, "A connected remote worker.", required=("id", "name", "pool", "labels", "slots", "busy", "connected_unix_ns",
                                           "health", "lease_expiries", "last_seen_unix_ns"))

WORKERS_OUT = Obj("WorkerList", {"workers": Array(WORKER, "In connection order (shard by shard)."),
                                  "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (present only when one was missing).")},
                  "Connected workers of the pools the caller may use.", required=("workers",))

SCHEDULE = Obj("Schedule", {
    "name": Text("Its name."),
    "cron": Text("The cron expression."),
    "tz": Text("The IANA zone; absent for UTC."),
    "pool": Text("The pool of its tasks."),
    "kind": Text("The kind of its tasks."),
    "overlap": Choice(OVERLAPS, "What happens when an occurrence is due while the previous one runs."),
    "next_unix_ns": UnixNs("The next occurrence; absent when none is due."),
    "last_task_id": Id("The task of the latest occurrence; absent before the first."),
}, "A recurring schedule.", required=("name", "cron", "pool", "kind", "overlap"))

SCHEDULES_OUT = Obj("ScheduleList", {"schedules": Array(SCHEDULE, "By name (shard by shard)."),
                                      "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (present only when one was missing).")},
                    "Recurring schedules of the pools the caller may use.", required=("schedules",))

GROUP = Obj("WorkerGroup", {
    "labels": Map(Text(), "The labels its workers carry."),
    "capacity": Integer("Slots of its connected workers.", maximum=2 ** 32 - 1),
    "busy": Integer("Busy slots.", maximum=2 ** 32 - 1),
}, "The workers of a pool that carry the same labels.", required=("labels", "capacity", "busy"))

_KINDS = {"count": Integer, "number": Number, "seconds": Seconds}
_POOL_NUMBERS: dict[str, Field] = {
    field.wire: Map(Integer(), field.doc) if field.kind == "classes" else _KINDS[field.kind](field.doc)
    for field in POOL_FIELDS}

POOL = Obj("PoolSnapshot", {
    "name": Text("The pool."),
    **_POOL_NUMBERS,
    "groups": Array(GROUP, "One per set of worker labels, unlabeled first."),
}, "A pool's state and its quality over the metrics window.",
    required=("name", *_POOL_NUMBERS, "groups"))

SNAPSHOT = Obj("Snapshot", {
    "pools": Array(POOL, "The pools the caller may use."),
    "live_tasks": Integer("Tasks not yet finished."),
    "running": Integer("Attempts running."),
    "pending": Integer("Tasks waiting to run."),
    "workers_connected": Integer("Connected workers of those pools."),
    "totals": Map(Integer(), "Counts since the leader started: submitted, dispatched, succeeded, failed, "
                             "dead_lettered, cancelled, skipped, missed, shed, retries, timeouts, "
                             "lease_expiries, stale_completions, recurring_conflicts, recurring_invalid."),
    "at_unix_ns": UnixNs("When it was taken."),
    "metrics_window_s": Seconds("The metrics window: the span the pools' attempt counts, waits and rates cover."),
    "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (empty when all "
                                        "answered, and without shards)."),
    "environment": Text("This server's deployment ([server] environment); empty when unnamed."),
    "region": Text("Its region ([server] region, or the catalog's); empty when unsaid."),
}, "The scheduler's state.", required=("pools", "live_tasks", "running", "pending", "workers_connected", "totals",
                                       "at_unix_ns", "metrics_window_s", "unavailable_shards", "environment",
                                       "region"))

ENVIRONMENT = Obj("Environment", {
    "name": Text("Its name in the catalog.", empty=False),
    "region": Text("Its region; empty when the catalog gives none."),
    "http": Text("Its HTTP URL (the dashboard is at /ui/ of it); empty when the catalog gives none."),
    "grpc": Text("Its gRPC target, as cronoq --server takes it; empty when the catalog gives none."),
    "description": Text("What the catalog says of it; may be empty."),
    "current": Flag("Whether it is this server's environment."),
}, "A deployment of the catalog.", required=("name", "region", "http", "grpc", "description", "current"))

ENVIRONMENTS_OUT = Obj("Environments", {
    "environment": Text("This server's deployment ([server] environment); empty when unnamed."),
    "region": Text("Its region; empty when unsaid."),
    "environments": Array(ENVIRONMENT, "The catalog ([environments]), in its order; empty without one."),
}, "This server's identity and the catalog of environments.", required=("environment", "region", "environments"))

TIMELINE_WORKER = Obj("TimelineWorker", {
    "id": Id("Assigned by the server, per connection (as in /v1/workers)."),
    "name": Text("What the worker registered as."),
    "pool": Text("The pool it serves."),
    "slots": Integer("Slots granted.", maximum=2 ** 32 - 1),
}, "A connected worker: the lanes of the timeline.", required=("id", "name", "pool", "slots"))

TIMELINE_ATTEMPT = Obj("TimelineAttempt", {
    "id": Id("The task."),
    "key": Text("Its key, if any."),
    "kind": Text("Its kind."),
    "pool": Text("Its pool."),
    "priority": Choice(PRIORITIES, "Its priority class."),
    "attempt": Integer("The attempt's number, from 1.", maximum=2 ** 32 - 1),
    "max_attempts": Integer("Attempts its retry policy allows.", maximum=2 ** 32 - 1),
    "status": Choice(STATUSES, "How the attempt ended; absent while it runs, or when it ended without a "
                               "status of its own (a lease handed to another worker)."),
    "message": Text("Why it failed, when it did."),
    "started_unix_ns": UnixNs("When it started."),
    "ended_unix_ns": UnixNs("When it ended; absent while it runs."),
    "worker_id": Id("The worker that got its lease; absent when not known."),
    "worker_name": Text("That worker's registered name (with worker_id)."),
    "deadline_unix_ns": UnixNs("The task's deadline; absent when it has none."),
    "missed_deadline": Flag("The attempt ended after the deadline, or runs past it now."),
}, "One attempt of the window.", required=("id", "kind", "pool", "priority", "attempt", "max_attempts",
                                           "started_unix_ns", "missed_deadline"))

TIMELINE_RESERVATION = Obj("TimelineReservation", {
    "id": Id("The fixed-start task."),
    "key": Text("Its key, if any."),
    "kind": Text("Its kind."),
    "pool": Text("Its pool."),
    "start_unix_ns": UnixNs("Its fixed start time."),
    "tolerance_s": Seconds("How late it may start (its tolerance)."),
    "held": Flag("The engine already holds a free slot of the pool for it."),
    "deadline_unix_ns": UnixNs("Its deadline; absent when it has none."),
}, "A fixed start not started yet.", required=("id", "kind", "pool", "start_unix_ns", "tolerance_s", "held"))

TIMELINE_HOLD = Obj("TimelineHold", {
    "pool": Text("The pool."),
    "held": Integer("Its slots held now for fixed starts about to begin.", maximum=2 ** 32 - 1),
    "task_ids": Array(Id(), "The tasks they are held for."),
}, "The slots a pool holds now.", required=("pool", "held", "task_ids"))

TIMELINE = Obj("Timeline", {
    "at_unix_ns": UnixNs("The leader's time of this answer: the timeline's now."),
    "range_s": Seconds("How far back the attempts go (range_s, capped)."),
    "ahead_s": Seconds("How far ahead the reservations go (ahead_s, capped)."),
    "workers": Array(TIMELINE_WORKER, "The connected workers of the pools, in connection order."),
    "attempts": Array(TIMELINE_ATTEMPT, "The attempts running now or that ran in the window, from the "
                                        "leader's record of recent tasks, by start time."),
    "reservations": Array(TIMELINE_RESERVATION, "The fixed starts not started yet that start within ahead_s, "
                                                "or already hold a slot, by start time."),
    "holds": Array(TIMELINE_HOLD, "The pools holding slots now, by name."),
    "unavailable_shards": Array(Text(), "With shards: the other shards serving the pools asked for (this "
                                        "answer is the answering shard's alone)."),
}, "The scheduling of a time window: attempts per worker, and the fixed starts ahead.",
    required=("at_unix_ns", "range_s", "ahead_s", "workers", "attempts", "reservations", "holds",
              "unavailable_shards"))

_CLASS_NAMES = ("critical", "high", "normal", "low")


def _series(doc: str) -> Array:
    return Array(Number(), doc)


def _by_class(name: str, doc: str) -> Obj:
    return Obj(name, {c: _series(f"{c.capitalize()} tasks.") for c in _CLASS_NAMES}, doc, required=_CLASS_NAMES)


POOL_HISTORY = Obj("PoolHistory", {
    "name": Text("The pool."),
    "t_unix_ms": Array(Integer(), "Each point's time, Unix milliseconds: the last sample of its bucket."),
    "capacity": _series("Slots of its connected workers (bucket mean)."),
    "desired": _series("The capacity its autoscaler asked for (bucket mean)."),
    "busy": _series("Slots running an attempt (bucket max)."),
    "held": _series("Free slots held for fixed starts (bucket max)."),
    "pending": _series("Tasks waiting to run (bucket max)."),
    "pending_by_class": _by_class("PendingByClassHistory", "Pending tasks by class (bucket max)."),
    "throughput_per_s": _series("Tasks succeeded per second between two samples (bucket mean)."),
    "failures_per_s": _series("Attempts failed per second between two samples: retrying, failed, dead-lettered "
                              "(bucket mean)."),
    "wait_p50_s": _series("Median wait over the metrics window at each sample (bucket mean)."),
    "wait_p99_s": _series("99th percentile wait (bucket mean)."),
    "wait_p50_s_by_class": _by_class("WaitP50ByClassHistory", "Median wait by class; 0 where a class had no "
                                                               "dispatch in the window (bucket mean)."),
    "wait_p99_s_by_class": _by_class("WaitP99ByClassHistory", "99th percentile wait by class (bucket mean)."),
    "cost": _series("Cost since the leader started (the bucket's last sample)."),
}, "One pool's history: every series has one value per point of t_unix_ms.",
    required=("name", "t_unix_ms", "capacity", "desired", "busy", "held", "pending", "pending_by_class",
              "throughput_per_s", "failures_per_s", "wait_p50_s", "wait_p99_s", "wait_p50_s_by_class",
              "wait_p99_s_by_class", "cost"))

HISTORY = Obj("History", {
    "interval_s": Seconds("How often the leader samples its pools (history.interval_s)."),
    "kept_s": Seconds("How long it keeps samples (history.kept_s)."),
    "at_unix_ns": UnixNs("When the answer was made."),
    "pools": Array(POOL_HISTORY, "The pools asked for that the caller may use."),
    "unavailable_shards": Array(Text(), "With shards: the shards that could not be asked (their pools are "
                                        "missing); empty otherwise."),
}, "The serving leader's recent history of its pools, since it became the leader (at most kept_s).",
    required=("interval_s", "kept_s", "at_unix_ns", "pools", "unavailable_shards"))

ERROR = Obj("Error", {
    "error": Text("What went wrong, naming the field or the limit."),
    "code": Text("The HTTP reason phrase, lower-case with underscores (not_found, too_many_requests...)."),
}, "Every error's body.", required=("error", "code"))
