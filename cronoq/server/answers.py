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
           "CANCEL_OUT", "REMOVED_OUT", "EXPLANATION", "WORKER", "WORKERS_OUT", "SCHEDULE", "SCHEDULES_OUT", "POOL", "SNAPSHOT",
           "ERROR", "BULK_CANCEL_OUT", "BULK_RESUBMIT_OUT"]

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
    "output_b64": Base64("The output's bytes, base64 (whenever output_available)."),
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
}, "A task's state. id and status are authoritative; the other fields are best effort (the leader's "
   "info cache, or the store).", required=("id", "status", "pool", "attempt", "output_available"))

WAIT_REASON = Obj("WaitReason", {
    "code": Choice(REASONS, "What holds it back (docs/server.md lists each code's detail)."),
    "message": Text("The reason, in a sentence."),
    "detail": Map(AnyJson(), "The reason's figures: which dependencies, labels, resource units, times..."),
}, "One reason a task is not running yet.", required=("code", "message", "detail"))

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
}, "The scheduler's state.", required=("pools", "live_tasks", "running", "pending", "workers_connected", "totals",
                                       "at_unix_ns", "metrics_window_s", "unavailable_shards"))

ERROR = Obj("Error", {
    "error": Text("What went wrong, naming the field or the limit."),
    "code": Text("The HTTP reason phrase, lower-case with underscores (not_found, too_many_requests...)."),
}, "Every error's body.", required=("error", "code"))
