"""The routes of the HTTP/JSON gateway, as data: what each takes and
answers, the role it needs, and the ``Gateway`` method that serves it (by
name). The gateway dispatches with this table and ``openapi.py`` documents
it; docs/server.md describes it."""

from __future__ import annotations

from dataclasses import dataclass

from .answers import (
    BATCH_OUT, BULK_CANCEL_OUT, BULK_RESUBMIT_OUT, CANCEL_OUT, EXPLANATION, INFO, RESULT, SCHEDULES_OUT, SNAPSHOT, STATUSES, SUBMIT_OUT, TASKS_OUT, WORKERS_OUT,
    REMOVED_OUT,
)
from .schema import BATCH, BULK_CANCEL, BULK_MAX, BULK_RESUBMIT, PRIORITIES, SUBMIT, BigInt, Choice, CommaList, Field, Id, Obj, Seconds, Text
from .schema import Integer as IntegerField

__all__ = ["Route", "ROUTES", "PATH_PARAMS"]


@dataclass(frozen=True)
class Route:
    """One route: what it takes and answers. ``role`` is the role its service
    call requires (None: no credentials needed); ``waits``: the request may
    also wait up to limits.max_wait_s; ``metrics_listener``: also served on
    server.metrics_addr (without credentials)."""

    method: str
    path: str
    operation: str
    summary: str
    handler: str           # the name of the Gateway method that serves it
    role: str | None = None
    body: Obj | None = None
    query: tuple[tuple[str, Field], ...] = ()
    response: Obj | None = None
    media: str = "application/json"
    statuses: tuple[int, ...] = ()
    waits: bool = False
    metrics_listener: bool = False
    description: str = ""
    also: tuple[str, ...] = ()       # other roles its handler serves (in part), and checks itself


PATH_PARAMS: dict[str, Field] = {
    "id": Id("A task id: decimal digits."),
    "key": Text("A task key, percent-encoded as one path segment (/ as %2F).", empty=False),
    "name": Text("A schedule's name, percent-encoded as one path segment (/ as %2F).", empty=False),
}

# ---------------------------------------------------------------- the routes

_POOLS = CommaList(Text(empty=False), "Only these pools (repeated, or comma-separated); default: every pool the "
                                      "caller may use.")
_TASK_ERRORS = (400, 401, 403, 404, 503)
_BY_ID = "/v1/tasks/{id}"
_BY_KEY = "/v1/tasks/by-key/{key}"

ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/tasks", "submit", "Submit a task", "submit", role="client", body=SUBMIT,
          response=SUBMIT_OUT, statuses=(400, 401, 403, 404, 409, 413, 415, 429, 503, 504), waits=True,
          description="With wait, answers once the task finished (504 after wait_timeout_s: the task keeps "
                      "running). With a store, answers after the task is stored."),
    Route("POST", "/v1/tasks:batch", "submit_batch", "Submit tasks atomically", "submit_batch", role="client",
          body=BATCH, response=BATCH_OUT, statuses=(400, 401, 403, 404, 409, 413, 415, 429, 503),
          description="All or none: an error names the offending task. Tasks may depend on keys defined anywhere "
                      "in the batch."),
    Route("GET", "/v1/tasks", "list_tasks", "List tasks", "list_tasks", role="client", response=TASKS_OUT,
          query=(("pool", _POOLS),
                 ("status", CommaList(Choice(STATUSES), "Only these statuses (repeated, or comma-separated).")),
                 ("after", BigInt("Only tasks with larger ids (the next_after of the previous page).", what="a task id")),
                 ("limit", IntegerField("Tasks per page: default 100, at most limits.max_list.", minimum=0,
                                        maximum=2 ** 32 - 1)),
                 ("priority", Choice(PRIORITIES, "Only tasks of this class (from the leader's record of recent "
                                                 "tasks: outputs.info_entries).")),
                 ("tenant", Text("Only tasks of this tenant (from the leader's record of recent tasks).",
                                 empty=False)),
                 ("q", Text("Search: all digits finds the task of that id; other text, the tasks whose key, kind, "
                            "tenant, message or a tag value holds it (case-insensitive; tenant and tags from "
                            "the leader's record of recent tasks).")),
                 ("order", Choice(("oldest", "newest"), "oldest (default): ascending ids, paged with after; "
                                                       "newest: descending ids, paged with before.")),
                 ("before", BigInt("With order=newest: only tasks with smaller ids (the next_before of the "
                                   "previous page).", what="a task id"))),
          statuses=_TASK_ERRORS, waits=True,
          description="Live and finished tasks in id order (newest first with order=newest). With priority, "
                      "tenant or q, one answer scans at most limits.max_list tasks: a page may hold fewer tasks "
                      "than limit while next_after (next_before) leads on."),
    Route("POST", "/v1/tasks:cancel", "cancel_tasks", "Cancel tasks", "cancel_many", role="client",
          body=BULK_CANCEL, response=BULK_CANCEL_OUT, statuses=(400, 401, 403, 413, 415, 503),
          description=f"Cancels each task named (at most {BULK_MAX} ids and {BULK_MAX} keys) as DELETE "
                      f"/v1/tasks/{{id}} would: one result per task, with the error (unknown task, another "
                      f"shard's...) of those it could not cancel."),
    Route("POST", "/v1/tasks:resubmit", "resubmit_tasks", "Submit dead-lettered tasks again", "resubmit_many",
          role="admin", body=BULK_RESUBMIT, response=BULK_RESUBMIT_OUT, statuses=(400, 401, 403, 413, 415, 503),
          description=f"As POST /v1/tasks/{{id}}:resubmit for each task named (at most {BULK_MAX}): one result "
                      f"per task, the new task's id or the error (not dead-lettered, payload no longer held...)."),
    Route("GET", _BY_ID, "get_task", "A task by id", "get", role="client", response=INFO,
          statuses=_TASK_ERRORS),
    Route("GET", _BY_KEY, "get_task_by_key", "A task by key", "get", role="client", response=INFO,
          statuses=_TASK_ERRORS),
    Route("GET", _BY_ID + ":explain", "explain_task", "Why a task waits", "explain", role="client",
          response=EXPLANATION, statuses=_TASK_ERRORS,
          description="From the leader's engine: the task's dispatch score, its place in its pool's line and "
                      "every reason it is not running yet (dependencies, awaited keys, start times and retry "
                      "backoffs, worker labels, resources, held slots, fair share, a full pool)."),
    Route("DELETE", _BY_ID, "cancel_task", "Cancel a task by id", "cancel", role="client",
          response=CANCEL_OUT, statuses=_TASK_ERRORS,
          description="cancelled is false when the task had already finished."),
    Route("DELETE", _BY_KEY, "cancel_task_by_key", "Cancel a task by key", "cancel", role="client",
          response=CANCEL_OUT, statuses=_TASK_ERRORS),
    Route("GET", _BY_ID + "/result", "task_result", "Wait for a task's result", "result", role="client",
          response=RESULT, statuses=(*_TASK_ERRORS, 504), waits=True,
          query=(("timeout_s", Seconds("How long to wait: default and most limits.max_wait_s; 0 answers at once.")),),
          description="504 while the task is still running after timeout_s: ask again."),
    Route("GET", _BY_KEY + "/result", "task_result_by_key", "Wait for a task's result, by key", "result",
          role="client", response=RESULT, statuses=(*_TASK_ERRORS, 504), waits=True,
          query=(("timeout_s", Seconds("How long to wait: default and most limits.max_wait_s; 0 answers at once.")),)),
    Route("POST", _BY_ID + ":resubmit", "resubmit_task", "Submit a dead-lettered task again", "resubmit",
          role="admin", response=SUBMIT_OUT, statuses=(400, 401, 403, 404, 409, 429, 503),
          description="A new task with the dead letter's payload and options, without its key, dependencies or "
                      "fixed start, tagged resubmitted_from. 409 when the task is not dead-lettered, or when the "
                      "leader no longer holds its payload (it keeps those of the last 1000 dead letters it saw)."),
    Route("GET", "/v1/workers", "list_workers", "Connected workers", "workers", role="metrics",
          response=WORKERS_OUT, query=(("pool", _POOLS),), statuses=_TASK_ERRORS),
    Route("GET", "/v1/recurring", "list_recurring", "Recurring schedules", "recurring", role="metrics",
          response=SCHEDULES_OUT, statuses=(401, 403, 503)),
    Route("DELETE", "/v1/recurring/{name}", "remove_recurring", "Remove a recurring schedule",
          "remove_recurring", role="admin", response=REMOVED_OUT, statuses=(400, 401, 403, 503),
          description="removed is false when no schedule of that name exists (in the pools the caller may use). "
                      "An occurrence already created still runs."),
    Route("GET", "/v1/events", "events", "Live events (Server-Sent Events)", "events", role="client",
          media="text/event-stream", also=("metrics",), query=(("pool", _POOLS), ("snapshot_s", Seconds(
              "How often a snapshot event comes (metrics role): default 1, at least 0.2; 0 for none.")),
              ("recent", IntegerField("First, up to this many of the latest status events the leader kept "
                                      "(it keeps the last 200) for the pools asked for, oldest first: default 0.",
                                      minimum=0, maximum=2 ** 32 - 1))),
          statuses=(400, 401, 403, 404, 429, 503),
          description="Needs the client role (status events) or the metrics role (snapshots); admin gets both. "
                      "A text/event-stream: hello (state, role, visible pools), status (a JSON array of status "
                      "events, every transition, batched), snapshot (as /v1/snapshot), "
                      "lagged (events were dropped: reconcile with the task routes), state (this server stopped "
                      "serving; the stream ends). With recent, the first status message holds up to that many of the "
                      "latest events the leader kept; after that, live only: after a reconnection, re-read what "
                      "you show."),
    Route("GET", "/v1/snapshot", "snapshot", "The scheduler's state", "snapshot", role="metrics",
          response=SNAPSHOT, statuses=(401, 403, 503)),
    Route("GET", "/metrics", "metrics", "Prometheus metrics", "metrics", role="metrics",
          media="text/plain", statuses=(401, 403, 503), metrics_listener=True,
          description="Prometheus text (the series of docs/metrics.md), of the pools the caller may use. On "
                      "server.metrics_addr, without credentials."),
    Route("GET", "/healthz", "healthz", "Liveness", "healthz", media="text/plain", metrics_listener=True,
          description="200 ok while the process runs."),
    Route("HEAD", "/healthz", "healthz_head", "Liveness (no body)", "healthz", media="text/plain",
          metrics_listener=True),
    Route("GET", "/readyz", "readyz", "Readiness", "readyz", media="text/plain", statuses=(503,),
          metrics_listener=True, description="200 ready on the serving leader, 503 on a standby or while stopping."),
    Route("HEAD", "/readyz", "readyz_head", "Readiness (no body)", "readyz", media="text/plain",
          statuses=(503,), metrics_listener=True),
    Route("GET", "/v1/openapi.json", "openapi", "This API, as OpenAPI 3.1", "openapi",
          description="Generated from the definitions the gateway validates requests with."),
)
