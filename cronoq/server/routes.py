"""The routes of the HTTP/JSON gateway, as data: what each takes and
answers, the role it needs, and the ``Gateway`` method that serves it (by
name). The gateway dispatches with this table and ``openapi.py`` documents
it; docs/server.md describes it."""

from __future__ import annotations

from dataclasses import dataclass

from .answers import (
    BATCH_OUT, BULK_CANCEL_OUT, BULK_RESUBMIT_OUT, CANCEL_OUT, DEPENDENTS_OUT, ENVIRONMENTS_OUT, EXPLANATION, HISTORY,
    INFO, RESULT, SCHEDULES_OUT, SNAPSHOT, STATUSES, SUBMIT_OUT, TASKS_OUT, WORKERS_OUT, REMOVED_OUT, TIMELINE,
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
_RESULT_QUERY = (
    ("timeout_s", Seconds("How long to wait: default and most limits.max_wait_s; 0 answers at once.")),
    ("max_bytes", IntegerField("Return at most this many bytes of the output (as output_text when JSON or "
                               "text, else output_b64), with output_size and output_truncated.",
                               minimum=0, maximum=2 ** 32 - 1)),
)
_BY_KEY = "/v1/tasks/by-key/{key}"
_DEPENDENTS_QUERY = (
    ("depth", IntegerField("How many levels down: default 1 (its direct dependents), at most 5.", minimum=1,
                           maximum=5)),
    ("limit", IntegerField("Dependents at most: default 100, at most limits.max_list.", minimum=1,
                           maximum=2 ** 32 - 1)),
)

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
    Route("GET", _BY_ID + "/dependents", "task_dependents", "The tasks that depend on a task", "dependents",
          role="client", response=DEPENDENTS_OUT, statuses=_TASK_ERRORS, query=_DEPENDENTS_QUERY,
          description="Level by level up to depth: the tasks that declared a dependency (after or deps) on this "
                      "task, by its id or its key, and then on those. From the leader's engine while a task has "
                      "not ended and from its record of recent tasks (outputs.info_entries) after: a dependent "
                      "the leader no longer remembers is not listed."),
    Route("GET", _BY_KEY + "/dependents", "task_dependents_by_key", "The tasks that depend on a task, by key",
          "dependents", role="client", response=DEPENDENTS_OUT, statuses=_TASK_ERRORS, query=_DEPENDENTS_QUERY),
    Route("DELETE", _BY_ID, "cancel_task", "Cancel a task by id", "cancel", role="client",
          response=CANCEL_OUT, statuses=_TASK_ERRORS,
          description="cancelled is false when the task had already finished."),
    Route("DELETE", _BY_KEY, "cancel_task_by_key", "Cancel a task by key", "cancel", role="client",
          response=CANCEL_OUT, statuses=_TASK_ERRORS),
    Route("GET", _BY_ID + "/result", "task_result", "Wait for a task's result", "result", role="client",
          response=RESULT, statuses=(*_TASK_ERRORS, 504), waits=True, query=_RESULT_QUERY,
          description="504 while the task is still running after timeout_s: ask again. With max_bytes, the "
                      "output's first max_bytes only, with output_size and output_truncated."),
    Route("GET", _BY_KEY + "/result", "task_result_by_key", "Wait for a task's result, by key", "result",
          role="client", response=RESULT, statuses=(*_TASK_ERRORS, 504), waits=True, query=_RESULT_QUERY),
    Route("POST", _BY_ID + ":resubmit", "resubmit_task", "Submit a dead-lettered task again", "resubmit",
          role="admin", response=SUBMIT_OUT, statuses=(400, 401, 403, 404, 409, 429, 503),
          description="A new task with the dead letter's payload and options, without its key, dependencies or "
                      "fixed start, tagged resubmitted_from. 409 when the task is not dead-lettered, or when the "
                      "leader no longer holds its payload (it keeps those of the last 1000 dead letters it saw)."),
    Route("GET", "/v1/workers", "list_workers", "Connected workers", "workers", role="metrics",
          response=WORKERS_OUT, query=(("pool", _POOLS),), statuses=_TASK_ERRORS),
    Route("GET", "/v1/timeline", "timeline", "Attempts per worker, and the fixed starts ahead", "timeline",
          role="client", response=TIMELINE, statuses=_TASK_ERRORS,
          query=(("pool", _POOLS),
                 ("range_s", Seconds("How far back attempts are drawn: default 300, at most 3600.")),
                 ("ahead_s", Seconds("How far ahead fixed starts are drawn: default 300, at most 3600 "
                                     "(those holding a slot are drawn whenever they start)."))),
          description="The dashboard's Timeline. Attempts come from the leader's record of recent tasks "
                      "(outputs.info_entries), with the worker that got each lease; reservations from the "
                      "engine's reservation calendars. With shards, the answering shard's alone (the others "
                      "in unavailable_shards)."),
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
                                      "(history.events: the last 1000 by default) for the pools asked "
                                      "for, oldest first: default 0.", minimum=0, maximum=2 ** 32 - 1))),
          statuses=(400, 401, 403, 404, 429, 503),
          description="Needs the client role (status events) or the metrics role (snapshots); admin gets both. "
                      "A text/event-stream: hello (state, role, visible pools, the environment and region), status (a JSON array of status "
                      "events, every transition, batched), snapshot (as /v1/snapshot), "
                      "lagged (events were dropped: reconcile with the task routes), state (this server stopped "
                      "serving; the stream ends). With recent, the first status message holds up to that many of the "
                      "latest events the leader kept; after that, live only: after a reconnection, re-read what "
                      "you show."),
    Route("GET", "/v1/snapshot", "snapshot", "The scheduler's state", "snapshot", role="metrics",
          response=SNAPSHOT, statuses=(401, 403, 503)),
    Route("GET", "/v1/history", "history", "The pools' recent history", "history", role="metrics",
          response=HISTORY, statuses=(400, 401, 403, 404, 503),
          query=(("pool", _POOLS),
                 ("range_s", Seconds("Only the latest range_s seconds: default everything kept (history.kept_s).")),
                 ("points", IntegerField("At most this many points per series: default 720. More samples than "
                                         "that are averaged in fixed buckets (busy, held and pending take the "
                                         "bucket's max, cost its last sample).", minimum=1, maximum=100_000))),
          description="One sample per pool every history.interval_s since this leader began (kept for "
                      "history.kept_s): capacity, desired, busy, held, pending (and by class), throughput and "
                      "failure rate, waits p50 and p99 (and by class), cost. With shards, every shard's pools."),
    Route("GET", "/v1/environments", "list_environments", "The catalog of environments", "environments",
          role="client", also=("metrics",), response=ENVIRONMENTS_OUT, statuses=(401, 403),
          description="Needs the client, metrics or admin role. This server's identity ([server] environment and "
                      "region) and the catalog of deployments ([environments]): name, region, HTTP URL, gRPC "
                      "target, description, and whether it is this one. Never a credential. Answered by a "
                      "standby too."),
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
