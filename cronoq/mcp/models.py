"""The typed arguments and answers of the MCP tools.

Argument aliases (``Annotated`` types carrying a description) are shared by
``submit_task``, the items of ``submit_batch`` and ``add_schedule``, so the
same option reads the same everywhere a model sees it. Answers are pydantic
models: the SDK publishes their JSON schema as each tool's output schema and
sends them as structured content (and as JSON text for older clients).
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import json
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from ..client import Explanation as ClientExplanation
from ..client import ScheduleInfo, TaskInfo, TaskResult, WorkerInfo
from ..core.options import RETRY_FIELDS, TASK_OPTIONS, option
from ..core.snapshot import POOL_FIELDS

__all__ = ["PriorityName", "StatusName", "TaskRef", "RetryInput", "DepInput", "TaskInput", "TaskView",
           "ResultView", "SubmitAnswer", "BatchAnswer", "CancelAnswer", "TaskPageView", "WorkerView",
           "ScheduleView", "WorkerList", "ScheduleList", "ScheduleAdded", "ScheduleRemoved", "GroupView",
           "PoolView", "SnapshotView", "TaskDetail", "PoolDetail", "DeadLetters", "DependencyView", "AttemptView", "ReasonView",
           "Explanation", "payload_bytes", "task_view", "explanation_view", "result_view", "worker_view", "schedule_view", "pool_view",
           "snapshot_view", "unix"]

# Literal types for the models' schemas (static, for type checkers); tests/test_vocabulary.py holds each to
# its list in cronoq.core.options.
PriorityName = Literal["critical", "high", "normal", "low"]
StatusName = Literal["blocked", "scheduled", "ready", "running", "retrying", "succeeded", "failed",
                     "dead_lettered", "cancelled", "skipped", "missed", "shed"]
OverlapName = Literal["skip", "allow", "queue", "queue_on_success"]
MissPolicyName = Literal["run_late", "skip", "fail"]
ConditionName = Literal["success", "failure", "complete"]
ReasonCode = Literal["dependencies", "awaiting_key", "start_time", "labels", "resource", "hold", "fair_share",
                     "pool_full", "next"]

# ---------------------------------------------------------------- arguments
# The task options' descriptions and bounds come from the task vocabulary (cronoq.core.options).


def _about(name: str, form: str = "") -> str:
    """The description of option ``name`` for a model: its meaning, the
    form the tool takes it in, and what omitting it means."""
    opt = option(name)
    text = opt.description()
    if form:
        text += f" {form}"
    if opt.default not in ("None", "()", "{}"):
        text += f" Omitted: {opt.default}."
    if opt.pair is not None:
        other = next(o for o in TASK_OPTIONS if o.pair == opt.pair and o is not opt)
        text += f" Not with {other.name}."
    return text.replace("`", "")


def _seconds(name: str) -> Any:
    """The bound of a duration option: > 0 or >= 0."""
    return Field(gt=0, description=_about(name)) if option(name).positive else Field(ge=0, description=_about(name))


_ISO = "As an ISO 8601 time (UTC when no offset is given)."

TaskRef = Annotated[int | str, Field(
    description="A task: its numeric id (an integer), or its key (a string).")]
Payload = Annotated[Any, Field(
    description="The task's input. A JSON object, array, number or boolean is sent as JSON "
                "(application/json); a string is sent as UTF-8 text (text/plain). Omit it for an empty "
                "payload; use payload_base64 for binary data.")]
PayloadBase64 = Annotated[str | None, Field(
    description="Binary input as base64, sent as application/octet-stream; instead of payload.")]
ContentType = Annotated[str | None, Field(
    description="Overrides the payload's content type (printable ASCII), e.g. application/x-ndjson.")]
PoolName = Annotated[str | None, Field(description=_about("pool"))]
Kind = Annotated[str | None, Field(description=_about("kind"))]
Priority = Annotated[PriorityName | None, Field(description=_about("priority"))]
Key = Annotated[str | None, Field(description=_about("key"))]
Tenant = Annotated[str | None, Field(description=_about("tenant", "Pools with fair share divide their slots "
                                                                 "between tenants."))]
DeadlineIn = Annotated[float | None, _seconds("deadline_in")]
DeadlineAt = Annotated[_dt.datetime | None, Field(description=_about("deadline_at", _ISO))]
StartIn = Annotated[float | None, _seconds("start_in")]
StartAt = Annotated[_dt.datetime | None, Field(description=_about("start_at", _ISO))]
Tolerance = Annotated[float | None, _seconds("tolerance")]
OnMiss = Annotated[MissPolicyName | None, Field(description=_about(
    "on_miss", "With a fixed start, when it cannot start within the tolerance: run_late, skip or fail."))]
Timeout = Annotated[float | None, _seconds("timeout")]
DurationHint = Annotated[float | None, _seconds("duration_hint")]
Resources = Annotated[dict[str, int] | None, Field(description=_about(
    "resources", "The names are those configured on the server."))]
After = Annotated[list[int | str] | None, Field(description=_about("after", "Ids or keys."))]
Tags = Annotated[dict[str, str] | None, Field(description=_about("tags"))]
Labels = Annotated[dict[str, str] | None, Field(description=_about("labels"))]
Stages = Annotated[list[str] | None, Field(description=_about("stages", 'For example ["chunk", "embed", "index"].'))]

_RETRY = {f.name: f for f in RETRY_FIELDS}


def _retry_field(name: str) -> Any:
    f = _RETRY[name]
    return Field(default=f.default, ge=f.minimum, le=f.maximum, description=f.doc[0].upper() + f.doc[1:] + ".")


class RetryInput(BaseModel):
    """How failed attempts are retried (omitted: the pool's policy)."""

    model_config = ConfigDict(extra="forbid")
    max_attempts: int = _retry_field("max_attempts")
    initial_backoff: float = _retry_field("initial_backoff")
    multiplier: float = _retry_field("multiplier")
    max_backoff: float = _retry_field("max_backoff")
    jitter: bool = Field(default=_RETRY["jitter"].default, description=_RETRY["jitter"].doc.capitalize() + ".")


Retry = Annotated[RetryInput | None, Field(description=_about("retry"))]


class DepInput(BaseModel):
    """A dependency with a condition."""

    model_config = ConfigDict(extra="forbid")
    task: TaskRef
    on: ConditionName = Field(
        default="success", description="Start after that task succeeded (default), failed, or finished either way.")


Deps = Annotated[list[DepInput] | None, Field(description=_about("deps"))]


class TaskInput(BaseModel):
    """One task of a batch: the options of submit_task."""

    model_config = ConfigDict(extra="forbid")
    payload: Payload = None
    payload_base64: PayloadBase64 = None
    content_type: ContentType = None
    pool: PoolName = None
    kind: Kind = None
    priority: Priority = None
    key: Key = None
    tenant: Tenant = None
    deadline_in: DeadlineIn = None
    deadline_at: DeadlineAt = None
    start_in: StartIn = None
    start_at: StartAt = None
    tolerance: Tolerance = None
    on_miss: OnMiss = None
    timeout: Timeout = None
    duration_hint: DurationHint = None
    retry: Retry = None
    resources: Resources = None
    after: After = None
    deps: Deps = None
    tags: Tags = None
    labels: Labels = None
    stages: Stages = None


def payload_bytes(payload_base64: str) -> bytes:
    try:
        return base64.b64decode(payload_base64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("payload_base64 is not valid base64") from None


# ---------------------------------------------------------------- answers


def unix(seconds: float | None) -> _dt.datetime | None:
    return None if seconds is None else _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)


class DependencyView(BaseModel):
    """A dependency as submitted."""

    task: int | str = Field(description="The task depended on: its id, or its key.")
    on: ConditionName = Field(description="When the dependent may run: once it succeeded, failed, or ended.")


class AttemptView(BaseModel):
    attempt: int
    status: StatusName | None = Field(description="How it ended (retrying, succeeded, failed...); null while it "
                                                  "runs.")
    message: str | None = Field(description="Why it failed, when it did.")
    started: _dt.datetime | None
    ended: _dt.datetime | None


class TaskView(BaseModel):
    """A task as the server knows it (fields other than id and status are best effort)."""

    id: int
    status: StatusName = Field(description="blocked (waiting for dependencies), scheduled (waiting for its "
                                           "fixed start), ready (queued), running, retrying (waiting out a "
                                           "backoff), or a final status: succeeded, failed, dead_lettered "
                                           "(failed after its last attempt), cancelled, skipped, missed, shed.")
    pool: str
    key: str | None
    kind: str
    priority: PriorityName
    tenant: str | None
    attempt: int = Field(description="The current or last attempt (0 before the first).")
    max_attempts: int
    message: str | None = Field(description="Why it failed, was cancelled or skipped.")
    output_available: bool = Field(description="Whether its output can still be read (wait_task).")
    tags: dict[str, str]
    labels: dict[str, str] = Field(description="The worker labels it asked for (a worker must carry them all).")
    dependencies: list[DependencyView] = Field(description="What it depends on (after and deps), as submitted.")
    attempts: list[AttemptView] = Field(description="Its attempts the server saw, oldest first (the latest 32).")
    created: _dt.datetime | None
    started: _dt.datetime | None = Field(description="When its latest attempt started.")
    finished: _dt.datetime | None
    stages: list[str] | None = Field(default=None, description="Its declared pipeline stages, in order.")
    completed_stages: list[str] | None = Field(
        default=None, description="The stages checkpointed so far, in stage order (a retry resumes after the "
                                  "last one); only when the task was looked up on its own.")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked when it was looked up by key; another task of the same key could be there (empty when every shard answered)."))


def task_view(info: TaskInfo) -> TaskView:
    return TaskView(id=info.id, status=cast(StatusName, info.status), pool=info.pool, key=info.key, kind=info.kind,
                    priority=cast(PriorityName, info.priority), tenant=info.tenant, attempt=info.attempt,
                    max_attempts=info.max_attempts, message=info.message, output_available=info.output_available,
                    tags=info.tags, labels=info.labels,
                    dependencies=[DependencyView(task=ref, on=cast(ConditionName, on)) for ref, on in info.deps],
                    attempts=[AttemptView(attempt=a.attempt, status=cast("StatusName | None", a.status),
                                          message=a.message, started=unix(a.started), ended=unix(a.ended))
                              for a in info.attempts],
                    created=unix(info.created), started=unix(info.started),
                    finished=unix(info.finished), stages=info.stages,
                    completed_stages=[c.stage for c in info.checkpoints] if info.stages else None,
                    unavailable_shards=list(info.unavailable_shards))


class ResultView(BaseModel):
    """A finished task and its output."""

    id: int
    status: StatusName
    ok: bool = Field(description="True when it succeeded.")
    message: str | None = Field(description="Why it did not succeed.")
    content_type: str | None = Field(description="The output's content type.")
    output: Any = Field(default=None, description="The output: parsed JSON for a JSON content type, a string for "
                                          "text; null when there is none or it is binary.")
    output_base64: str | None = Field(default=None, description="A binary output, as base64.")
    output_available: bool = Field(description="False when the task produced no output or the server no "
                                               "longer keeps it.")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked when it was looked up by key (empty when every shard answered)."))


def result_view(result: TaskResult) -> ResultView:
    output: Any = None
    output_base64 = None
    ctype = result.content_type or ("application/octet-stream" if result.output is not None else "")
    if result.output is not None:
        media = ctype.split(";", 1)[0].strip().lower()
        try:
            if media == "application/json" or media.endswith("+json"):
                output = json.loads(result.output)
            elif media.startswith("text/"):
                output = result.output.decode("utf-8")
            else:
                output_base64 = base64.b64encode(result.output).decode("ascii")
        except (ValueError, UnicodeDecodeError):
            output = None
            output_base64 = base64.b64encode(result.output).decode("ascii")
    return ResultView(id=result.id, status=cast(StatusName, result.status), ok=result.ok, message=result.message,
                      content_type=ctype or None, output=output, output_base64=output_base64,
                      output_available=result.output_available, unavailable_shards=list(result.unavailable_shards))


class SubmitAnswer(BaseModel):
    id: int = Field(description="The task's id (use it with wait_task, get_task, cancel_task).")
    duplicate: bool = Field(description="True when the key named an existing task: nothing new was created.")
    result: ResultView | None = Field(default=None, description="With wait=true, the result once it finished.")
    note: str | None = Field(default=None, description="With wait=true, why there is no result yet.")


class BatchAnswer(BaseModel):
    tasks: list[SubmitAnswer] = Field(description="One per submitted task, in the order given.")


class CancelAnswer(BaseModel):
    task: int | str
    cancelled: bool = Field(description="True if this call cancelled it; false if it had already finished.")


class TaskPageView(BaseModel):
    tasks: list[TaskView]
    next_after: int | None = Field(description="Pass it as 'after' for the next page; null on the last page.")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked: their tasks are not listed (empty when every shard answered)."))


class WorkerView(BaseModel):
    id: int = Field(description="The id of the worker's connection.")
    name: str
    pool: str
    labels: dict[str, str]
    slots: int = Field(description="Tasks it may run at once (granted by the server).")
    busy: int = Field(description="Tasks it is running now.")
    connected: _dt.datetime | None
    health: Literal["healthy", "suspect"] = Field(
        description="suspect: a lease of it expired while it sent nothing (paused, frozen or cut off); it gets no "
                    "new task until it speaks again.")
    lease_expiries: int = Field(description="Its leases that expired (no heartbeat in time).")


def worker_view(worker: WorkerInfo) -> WorkerView:
    return WorkerView(id=worker.id, name=worker.name, pool=worker.pool, labels=worker.labels, slots=worker.slots,
                      busy=worker.busy, connected=unix(worker.connected),
                      health="suspect" if worker.health == "suspect" else "healthy",
                      lease_expiries=worker.lease_expiries)


class ScheduleView(BaseModel):
    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    overlap: OverlapName
    next_at: _dt.datetime | None = Field(description="The next occurrence; null when none is due.")
    last_task_id: int | None = Field(description="The task of the latest occurrence.")


def schedule_view(schedule: ScheduleInfo) -> ScheduleView:
    return ScheduleView(name=schedule.name, cron=schedule.cron, tz=schedule.tz, pool=schedule.pool,
                        kind=schedule.kind, overlap=cast(OverlapName, schedule.overlap), next_at=unix(schedule.next_at),
                        last_task_id=schedule.last_task_id)


class WorkerList(BaseModel):
    workers: list[WorkerView] = Field(description="Connected workers, in connection order.")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked: their workers are not listed (empty when every shard answered)."))


class ScheduleList(BaseModel):
    schedules: list[ScheduleView] = Field(description="Recurring schedules, by name.")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked: their schedules are not listed (empty when every shard answered)."))


class ScheduleAdded(BaseModel):
    name: str
    next_at: _dt.datetime | None = Field(description="Its first occurrence.")


class ScheduleRemoved(BaseModel):
    name: str
    removed: bool = Field(description="False when there was no schedule of that name.")


class GroupView(BaseModel):
    labels: dict[str, str]
    capacity: int
    busy: int


_POOL = {f.wire: f.doc for f in POOL_FIELDS}


class PoolView(BaseModel):
    """A pool's state and its quality figures over the metrics window (the
    fields of POOL_FIELDS in cronoq.core.snapshot, with their descriptions)."""

    name: str
    capacity: int = Field(description=_POOL["capacity"])
    busy: int = Field(description=_POOL["busy"])
    held: int = Field(description=_POOL["held"])
    desired: int = Field(description=_POOL["desired"])
    pending: int = Field(description=_POOL["pending"])
    pending_by_class: dict[str, int] = Field(description=_POOL["pending_by_class"])
    reservations: int = Field(description=_POOL["reservations"])
    dispatched: int = Field(description=_POOL["dispatched"])
    succeeded: int = Field(description=_POOL["succeeded"])
    failed: int = Field(description=_POOL["failed"])
    priority_adherence: float = Field(description=_POOL["priority_adherence"])
    fixed_start_hit_rate: float = Field(description=_POOL["fixed_start_hit_rate"])
    utilization: float = Field(description=_POOL["utilization"])
    schedule_efficiency: float = Field(description=_POOL["schedule_efficiency"])
    wait_p50_s: float = Field(description=_POOL["wait_p50_s"])
    wait_p90_s: float = Field(description=_POOL["wait_p90_s"])
    wait_p99_s: float = Field(description=_POOL["wait_p99_s"])
    cost: float = Field(description=_POOL["cost"])
    workers_connected: int = Field(description=_POOL["workers_connected"])
    groups: list[GroupView] = Field(description="Capacity per set of worker labels.")


def pool_view(pool: dict[str, Any]) -> PoolView:
    return PoolView.model_validate(pool)


class SnapshotView(BaseModel):
    at: _dt.datetime | None
    pools: list[PoolView]
    live_tasks: int
    running: int
    pending: int
    workers_connected: int
    totals: dict[str, int] = Field(description="Counts since the server started: submitted, succeeded, failed, "
                                               "dead_lettered, cancelled, retries, ...")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked: their pools are not shown and the counts leave them out (empty when every shard answered)."))


def snapshot_view(snapshot: dict[str, Any]) -> SnapshotView:
    return SnapshotView(at=unix(snapshot["at"]), pools=[pool_view(p) for p in snapshot["pools"]],
                        live_tasks=snapshot["live_tasks"], running=snapshot["running"], pending=snapshot["pending"],
                        workers_connected=snapshot["workers_connected"], totals=snapshot["totals"],
                        unavailable_shards=snapshot.get("unavailable_shards", []))


class TaskDetail(BaseModel):
    """A task, and its result once it finished."""

    task: TaskView
    result: ResultView | None


class PoolDetail(BaseModel):
    pool: PoolView
    workers: list[WorkerView]


class DeadLetters(BaseModel):
    tasks: list[TaskView] = Field(description="The most recent dead-lettered tasks, newest first.")
    scanned: int = Field(description="Dead-lettered tasks the server listed.")
    complete: bool = Field(description="False when the scan stopped before the newest ones.")


class ReasonView(BaseModel):
    """One reason a task is not running yet."""

    code: ReasonCode = Field(description=(
        "dependencies (unfinished parents), awaiting_key (a key no task has yet), start_time (a fixed start "
        "or a retry backoff to wait out), labels (no free worker carries its labels), resource (units other "
        "tasks hold), hold (a slot is held for its fixed start), fair_share (its tenant had more than its "
        "share), pool_full (no free slot), next (nothing: it starts at the next dispatch)."))
    message: str = Field(description="The reason in a sentence.")
    detail: dict[str, Any] = Field(description="Its figures: which parents and their status, labels asked and "
                                               "the matching worker groups, resource units asked and free, "
                                               "times (Unix seconds)...")


class Explanation(BaseModel):
    """Why a task is (or is not) waiting, from the leader's engine."""

    task: TaskView
    waiting: bool = Field(description="True while something holds it back (reasons is not empty).")
    summary: str = Field(description="Where it stands and the main reason, in a sentence or two.")
    reasons: list[ReasonView] = Field(description="Every reason it waits; empty while it runs or once it ended.")
    score: float | None = Field(description="Its dispatch score now (class base + aging + deadline urgency), "
                                            "while it is ready in its pool's queues.")
    position: int | None = Field(description="Its place in its pool's line (1 = the next to start), while it is "
                                             "ready in its pool's queues.")
    queued: int = Field(description="Ready tasks in its pool's queues.")
    pool: PoolView | None = Field(description="Its pool now, while it waits (null without the metrics role).")
    unavailable_shards: list[str] = Field(default_factory=list, description=(
        "With shards: the shards that could not be asked when it was looked up by key (empty when every shard "
        "answered)."))


def explanation_view(explained: ClientExplanation, info: TaskInfo, pool: PoolView | None) -> Explanation:
    return Explanation(task=task_view(info), waiting=explained.waiting, summary=explained.summary,
                       reasons=[ReasonView(code=cast(ReasonCode, r.code), message=r.message, detail=r.detail)
                                for r in explained.reasons],
                       score=explained.score, position=explained.position, queued=explained.queued, pool=pool,
                       unavailable_shards=list(explained.unavailable_shards))


class LLMAnswer(BaseModel):
    """An LLM task run by run_llm_task: its text (or embeddings), usage and cost."""

    id: int
    status: StatusName | None = Field(default=None, description="The task's status; null while it still runs.")
    text: str | None = Field(default=None, description="The generated text (llm.chat, llm.complete).")
    embeddings: list[list[float]] | None = Field(default=None, description="The vectors (llm.embed).")
    model: str | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = Field(default=None, description="prompt_tokens, completion_tokens, total_tokens.")
    cost: float | None = Field(default=None, description="By the worker's price table.")
    message: str | None = Field(default=None, description="Why it did not succeed.")
    note: str | None = Field(default=None, description="When it has not finished yet: what to do next.")
