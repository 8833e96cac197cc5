"""The MCP server: cronoq-server's API as tools, resources and prompts.

``build_server(client)`` returns an ``mcp.server.mcpserver.MCPServer`` whose
every tool and resource is one or a few calls of ``cronoq.client.Client``,
made when the tool is called or the resource read (nothing is cached). The
client's credential decides what is allowed: the server's roles apply as
they are. A refused call becomes a tool error (or a resource error) carrying
the server's status code and message; nothing is retried here.
"""

import contextlib
import datetime as _dt
import zoneinfo
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, cast

from mcp.server.mcpserver import MCPServer, ResourceSecurity
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.types import (
    Completion, CompletionArgument, CompletionContext, PromptReference, ResourceTemplateReference, ToolAnnotations,
)
from pydantic import Field, ValidationError

from .. import errors as _errors
from ..client import Client, TaskInfo, wire
from ..core.types import TERMINAL, Dep, RetryPolicy
from . import prompts
from .models import (
    After, BatchAnswer, CancelAnswer, ContentType, DeadLetters, DeadlineAt, DeadlineIn, Deps, DurationHint,
    Explanation, Key, Kind, Labels, OnMiss, OverlapName, Payload, PayloadBase64, PoolDetail, PoolName, Priority,
    LLMAnswer, ResultView, Resources, Retry, ScheduleAdded, ScheduleList, ScheduleRemoved, SnapshotView, Stages, StartAt, StartIn,
    StatusName, SubmitAnswer, Tags, TaskDetail, TaskInput, TaskPageView, TaskRef, TaskView, Tenant, Timeout, Tolerance,
    WorkerList, explanation_view, payload_bytes, pool_view, result_view, schedule_view, snapshot_view, task_view,
    worker_view,
)

__all__ = ["build_server", "describe_error", "INSTRUCTIONS", "WHAT_IF_INSTRUCTIONS"]

INSTRUCTIONS = """\
cronoq is a priority-aware task scheduler; this server drives one cronoq-server. Tasks go to pools served by
workers; each task has a class (critical > high > normal > low), and may have a deadline, a fixed start,
dependencies, resource requests, labels and a key (a unique name: resubmitting a key returns the existing task).
Submit with submit_task (or submit_batch for several tasks and dependency graphs), follow with get_task and
wait_task (which returns the output), cancel with cancel_task, look around with list_tasks, snapshot and
list_workers, ask explain_task why a task waits, and manage cron schedules with list_schedules, add_schedule
and remove_schedule. Resources give live views (cronoq://snapshot, cronoq://pools/{pool}, cronoq://tasks/{id},
cronoq://keys/{key}, cronoq://schedules, cronoq://workers, cronoq://dead-letters). The server's roles apply:
a refused call is an error naming the status code (PERMISSION_DENIED, NOT_FOUND, INVALID_ARGUMENT...)."""

WHAT_IF_INSTRUCTIONS = """
Before recommending a change of pool settings, compare the candidates with what_if: it replays a recorded workload
under each policy variant in virtual time (nothing runs on the server)."""

_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    ((_errors.UnknownTask, _errors.UnknownPool), "NOT_FOUND"),
    ((_errors.QueueFull, _errors.ReservationConflict), "RESOURCE_EXHAUSTED"),
    (_errors.AdmissionError, "INVALID_ARGUMENT"),
    (TimeoutError, "DEADLINE_EXCEEDED"),
    (_errors.SchedulerError, "UNAVAILABLE"),
)
# What cronoq.client raises for a failed call (wire.error_from); anything else is a bug and surfaces as one.
_CALL_ERRORS = (_errors.ServerError, _errors.UnknownTask, _errors.AdmissionError, TimeoutError,
                _errors.SchedulerError)


def describe_error(exc: BaseException, target: str) -> tuple[str, str]:
    """(status code, message for the agent) of an error raised by a ``cronoq.client`` call."""
    if isinstance(exc, _errors.ServerError):
        code, message = exc.code, exc.message
    else:
        code = next((c for kinds, c in _CODES if isinstance(exc, kinds)), "UNKNOWN")
        message = str(exc)
    if code == "UNAVAILABLE" and ("failed to connect" in message or "DNS resolution failed" in message):
        return code, (f"cannot reach cronoq-server at {target} (UNAVAILABLE: {message}). Check that it runs and "
                      "that the address is right; this gateway does not retry.")
    if code == "UNAVAILABLE":
        return code, (f"cronoq-server at {target} is not serving (UNAVAILABLE: {message}); it is unreachable, "
                      "standing by or stopping. This gateway does not retry: try again later.")
    return code, f"cronoq-server refused the call: {code}: {message}"


_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
_REPLACE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                           open_world_hint=False)
_REMOVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)

Pools = Annotated[list[str] | None, Field(description="Only these pools; omitted: every pool the token may use.")]
Statuses = Annotated[list[StatusName] | None, Field(description="Only these statuses; omitted: any.")]
WaitTimeout = Annotated[float, Field(ge=0, le=3600, description=(
    "Seconds to wait at most (the server caps it at its limits.max_wait_s, 300 by default); 0 answers at once."))]
ScheduleName = Annotated[str, Field(description="The schedule's unique name.")]

DEAD_LETTER_PAGES = 20      # cronoq://dead-letters reads at most this many pages
RECENT_DEAD_LETTERS = 50
MAX_COMPLETIONS = 100     # the protocol's limit of values in one completion


def task_options(task: TaskInput) -> dict[str, Any]:
    """``Client.submit`` keyword arguments for ``task`` (ValueError for what cannot be sent)."""
    values = task.model_dump(exclude_none=True, exclude={"payload_base64", "retry", "deps"})
    if task.payload_base64 is not None:
        if task.payload is not None:
            raise ValueError("give payload or payload_base64, not both")
        values["payload"] = payload_bytes(task.payload_base64)
    if task.retry is not None:
        values["retry"] = RetryPolicy(**task.retry.model_dump())
    if task.deps:
        values["deps"] = [Dep(d.task, d.on) for d in task.deps]
    for name in ("deadline_at", "start_at"):
        value = getattr(task, name)
        if value is not None:
            values[name] = value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)
    wire.task_message(**values)   # local checks first: a refusal here sent nothing
    return values


def _argument_problem(error: Any) -> str:
    """One refused argument, in our words (a pydantic error: its location, type and context)."""
    where = ".".join(str(part) for part in error.get("loc", ())) or "the arguments"
    kind = error.get("type", "")
    context = error.get("ctx") or {}
    given = error.get("input")
    got = f", got {given!r}"[:80] if kind != "missing" else ""
    if kind == "missing":
        return f"{where} is required"
    if kind == "extra_forbidden":
        return f"{where} is not an argument of this tool"
    if kind == "literal_error" or kind == "enum":
        return f"{where} must be one of {context.get('expected', '')}{got}"
    bounds = {"greater_than_equal": "at least", "greater_than": "more than", "less_than_equal": "at most",
              "less_than": "less than"}
    if kind in bounds:
        limit = next(iter(context.values()), "")
        return f"{where} must be {bounds[kind]} {limit}{got}"
    if kind in ("too_short", "too_long"):
        return f"{where} must have {'at least' if kind == 'too_short' else 'at most'} " \
               f"{context.get('min_length', context.get('max_length', ''))} item(s)"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        expected = kind.rsplit("_", 1)[0].replace("_", " ")
        return f"{where} must be {'an' if expected[:1] in 'aeiou' else 'a'} {expected}{got}"
    message = str(error.get("msg", "is not valid"))
    return f"{where}: {message[:1].lower()}{message[1:]}{got}"


class _Server(MCPServer[Any]):
    """The SDK's server, with refused arguments told in our words (the SDK
    sends pydantic's text, with its internal type names and links)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                problems = "; ".join(_argument_problem(e) for e in cause.errors())
                raise ToolError(f"Error executing tool {name}: invalid arguments, nothing was sent: {problems}"
                                ) from cause
            raise


def build_server(client: Client, *, name: str = "cronoq", traces: Path | None = None) -> MCPServer[Any]:
    """An MCP server driving the cronoq-server behind ``client`` (its token's role applies).

    ``traces``, a directory of recorded workloads, adds the what_if tool (it
    needs cronoq's simulator, ``cronoq.whatif``: ValueError without it)."""
    from .. import __version__

    target = client.target
    instructions = INSTRUCTIONS + (WHAT_IF_INSTRUCTIONS if traces is not None else "")
    app: MCPServer[Any] = _Server(name, title="cronoq", version=__version__, instructions=instructions)

    @contextlib.contextmanager
    def calls() -> Iterator[None]:
        """Turn what a cronoq.client call raises into a tool error."""
        try:
            yield
        except _CALL_ERRORS as exc:
            raise ToolError(describe_error(exc, target)[1]) from None

    @contextlib.contextmanager
    def reads() -> Iterator[None]:
        """The same for resources: an unknown task or pool is 'not found'."""
        try:
            yield
        except _CALL_ERRORS as exc:
            code, message = describe_error(exc, target)
            raise (ResourceNotFoundError if code == "NOT_FOUND" else ResourceError)(message) from None

    def checked(task: TaskInput) -> dict[str, Any]:
        try:
            return task_options(task)
        except (ValueError, TypeError) as exc:
            raise ToolError(f"invalid arguments, nothing was sent: {exc}") from None

    # ------------------------------------------------------------ tools: tasks

    @app.tool(annotations=_ADD)
    async def submit_task(payload: Payload = None, payload_base64: PayloadBase64 = None,
                          content_type: ContentType = None, pool: PoolName = None, kind: Kind = None,
                          priority: Priority = None, key: Key = None, tenant: Tenant = None,
                          deadline_in: DeadlineIn = None, deadline_at: DeadlineAt = None, start_in: StartIn = None,
                          start_at: StartAt = None, tolerance: Tolerance = None, on_miss: OnMiss = None,
                          timeout: Timeout = None, duration_hint: DurationHint = None, retry: Retry = None,
                          resources: Resources = None, after: After = None, deps: Deps = None, tags: Tags = None,
                          labels: Labels = None, stages: Stages = None,
                          wait: Annotated[bool, Field(description=(
                              "Wait for the task to finish and return its result (see wait_timeout)."))] = False,
                          wait_timeout: WaitTimeout = 30.0) -> SubmitAnswer:
        """Submit one task to cronoq-server. Returns its id at once, or with wait=true its result once it
        finished (if it is still running after wait_timeout, the answer says so: follow it with wait_task)."""
        given = locals()
        task = TaskInput.model_validate({field: given[field] for field in TaskInput.model_fields})
        options = checked(task)
        with calls():
            submission = await client.submit(**options)
        answer = SubmitAnswer(id=submission.id, duplicate=submission.duplicate)
        if wait:
            try:
                answer.result = result_view(await client.wait(submission.id, wait_timeout))
            except TimeoutError:
                answer.note = (f"task {submission.id} has not finished after {wait_timeout:g} s; "
                               "call wait_task to wait longer")
            except _CALL_ERRORS as exc:
                answer.note = f"submitted, but waiting failed: {describe_error(exc, target)[1]}"
        return answer

    @app.tool(annotations=_ADD)
    async def run_llm_task(
            prompt: Annotated[str | None, Field(description=(
                "The user message (llm.chat), the prompt (llm.complete) or the text to embed (llm.embed)."))] = None,
            messages: Annotated[list[dict[str, Any]] | None, Field(description=(
                "llm.chat: the conversation as OpenAI messages ({role, content}), instead of prompt."))] = None,
            kind: Annotated[Literal["llm.chat", "llm.complete", "llm.embed"], Field(description=(
                "What the LLM worker does."))] = "llm.chat",
            model: Annotated[str | None, Field(description="The model; the worker's default when omitted.")] = None,
            system: Annotated[str | None, Field(description="llm.chat: a system prompt.")] = None,
            temperature: Annotated[float | None, Field(ge=0, le=2, description=(
                "Sampling temperature; the worker's default when omitted."))] = None,
            max_tokens: Annotated[int | None, Field(ge=1, description=(
                "The most tokens to generate (and part of the tokens reserved); the worker's default when "
                "omitted."))] = None,
            pool: Annotated[str, Field(description="The pool cronoq-llm-worker serves.")] = "llm",
            priority: Priority = None, deadline_in: DeadlineIn = None, timeout: Timeout = None,
            rpm_resource: Annotated[str | None, Field(description=(
                "A requests-per-minute token bucket of the server: the task takes 1 unit."))] = None,
            tpm_resource: Annotated[str | None, Field(description=(
                "A tokens-per-minute token bucket of the server: the task takes its estimated tokens "
                "(prompt characters / 4 + max_tokens)."))] = None,
            key: Key = None, wait_timeout: WaitTimeout = 120.0) -> LLMAnswer:
        """Run one LLM inference end to end on cronoq-llm-worker: submit it, wait for it, return the text
        (or embeddings) with its usage and cost. If it has not finished after wait_timeout, the answer
        says so; follow it with wait_task (the task keeps its place)."""
        from ..llm import resources_for
        payload: dict[str, Any] = {"messages": messages} if messages is not None else {"prompt": prompt}
        if kind == "llm.embed":
            payload = {"input": prompt}
        if prompt is None and messages is None:
            raise ToolError("invalid arguments, nothing was sent: give prompt or messages")
        for field, value in (("model", model), ("system", system), ("temperature", temperature),
                             ("max_tokens", max_tokens)):
            if value is not None:
                payload[field] = value
        options: dict[str, Any] = {"pool": pool, "kind": kind}
        for field, value in (("priority", priority), ("deadline_in", deadline_in), ("timeout", timeout),
                             ("key", key)):
            if value is not None:
                options[field] = value
        amounts = resources_for(payload, rpm=rpm_resource, tpm=tpm_resource)
        if amounts:
            options["resources"] = amounts
        with calls():
            submission = await client.submit(payload, **options)
        answer = LLMAnswer(id=submission.id)
        try:
            result = await client.wait(submission.id, wait_timeout)
        except TimeoutError:
            answer.note = f"task {submission.id} has not finished after {wait_timeout:g} s; call wait_task"
            return answer
        except _CALL_ERRORS as exc:
            answer.note = f"submitted, but waiting failed: {describe_error(exc, target)[1]}"
            return answer
        answer.status = result.status   # type: ignore[assignment]
        answer.message = result.message
        if result.ok:
            out = result.json()
            if isinstance(out, dict):
                for field in ("text", "embeddings", "model", "finish_reason", "usage", "cost"):
                    setattr(answer, field, out.get(field))
        return answer

    @app.tool(annotations=_ADD)
    async def submit_batch(tasks: Annotated[list[TaskInput], Field(min_length=1, description=(
            "The tasks, each with the options of submit_task. A task's 'after' or 'deps' may name the key of "
            "another task of the batch, which makes the batch a dependency graph (cycles are refused)."))]
                           ) -> BatchAnswer:
        """Submit several tasks atomically: all are admitted or none is (the error names the offending task).
        Returns their ids in the order given."""
        options = []
        for index, task in enumerate(tasks):
            try:
                options.append(task_options(task))
            except (ValueError, TypeError) as exc:
                raise ToolError(f"invalid arguments, nothing was sent: task {index}: {exc}") from None
        with calls():
            submissions = await client.submit_batch(options)
        return BatchAnswer(tasks=[SubmitAnswer(id=s.id, duplicate=s.duplicate) for s in submissions])

    @app.tool(annotations=_READ)
    async def get_task(task: TaskRef) -> TaskView:
        """A task's status, pool, class, attempt, failure message, tags and times."""
        with calls():
            return task_view(await client.get(task))

    @app.tool(annotations=_READ)
    async def wait_task(task: TaskRef, timeout: WaitTimeout = 30.0) -> ResultView:
        """Wait until a task finished and return its result: status, output (parsed JSON, text, or base64)
        and failure message. If it has not finished within the timeout, the call fails with
        DEADLINE_EXCEEDED and the task keeps running: call again to wait longer."""
        with calls():
            return result_view(await client.wait(task, timeout))

    @app.tool(annotations=_REMOVE)
    async def cancel_task(task: TaskRef) -> CancelAnswer:
        """Cancel a task that has not finished (a running attempt is aborted). cancelled=false means it had
        already finished."""
        with calls():
            return CancelAnswer(task=task, cancelled=await client.cancel(task))

    @app.tool(annotations=_READ)
    async def list_tasks(pools: Pools = None, statuses: Statuses = None,
                         after: Annotated[int, Field(ge=0, description=(
                             "Only tasks with a larger id: the next_after of the previous page."))] = 0,
                         limit: Annotated[int, Field(ge=1, le=1000, description=(
                             "Tasks per page (the server caps it at its limits.max_list)."))] = 50,
                         ) -> TaskPageView:
        """One page of tasks in id order, oldest first, optionally only some pools and statuses (e.g.
        statuses=["dead_lettered"], or ["ready", "running"] for live work). Finished tasks are listed while
        the server keeps them."""
        with calls():
            page = await client.list(pools=pools or (), statuses=statuses or (), after=after, limit=limit)
        return TaskPageView(tasks=[task_view(t) for t in page.tasks], next_after=page.next_after,
                            unavailable_shards=list(page.unavailable_shards))

    @app.tool(annotations=_READ)
    async def explain_task(task: TaskRef) -> Explanation:
        """Why a task is waiting (or that it is not), from the leader's engine: its dispatch score and place in
        its pool's line when it is queued, and every reason it does not run yet: unfinished dependencies, a key
        no task has yet, a fixed start or retry backoff to wait out, labels no free worker carries, resource
        units other tasks hold, a slot held for its fixed start, its tenant's fair share, a full pool. With the
        metrics role, its pool's figures too."""
        with calls():
            explained = await client.explain(task)
            info = await client.get(explained.id)
        pool = None
        if explained.waiting:
            try:
                snapshot = await client.snapshot()
            except _CALL_ERRORS:
                pass   # the pool's figures need the metrics role: the explanation stands without them
            else:
                found = next((p for p in snapshot["pools"] if p["name"] == explained.pool), None)
                pool = pool_view(found) if found is not None else None
        return explanation_view(explained, info, pool)

    # ------------------------------------------------------------ tools: the server

    @app.tool(annotations=_READ)
    async def snapshot() -> SnapshotView:
        """The server now: every pool's capacity, busy slots, desired capacity, backlog by class, waits
        (p50/p90/p99), utilization and counts, plus totals since the server started. Needs the metrics
        role."""
        with calls():
            return snapshot_view(await client.snapshot())

    @app.tool(annotations=_READ)
    async def list_workers(pools: Pools = None) -> WorkerList:
        """The connected workers: pool, labels, slots granted and slots busy. Needs the metrics role."""
        with calls():
            workers = await client.workers(pools=pools or ())
        return WorkerList(workers=[worker_view(w) for w in workers],
                          unavailable_shards=list(workers.unavailable_shards))

    @app.tool(annotations=_READ)
    async def list_schedules() -> ScheduleList:
        """The recurring (cron) schedules: cron expression, zone, pool, overlap policy, next occurrence and
        the last task they created. Needs the metrics role."""
        with calls():
            schedules = await client.recurring()
        return ScheduleList(schedules=[schedule_view(s) for s in schedules],
                            unavailable_shards=list(schedules.unavailable_shards))

    @app.tool(annotations=_REPLACE)
    async def add_schedule(
            name: ScheduleName,
            cron: Annotated[str, Field(description=(
                "When: five cron fields (minute hour day month weekday), or six with seconds first, or "
                "@hourly, @daily, @weekly, @monthly, @yearly. Example: '30 2 * * *' is 02:30 every day."))],
            tz: Annotated[str, Field(description="The IANA time zone of the cron times, e.g. Europe/Paris.")] = "UTC",
            overlap: Annotated[OverlapName, Field(description=(
                "When an occurrence comes while the previous one still runs: skip it (default), allow both, "
                "queue it, or queue_on_success (only if the previous one succeeds)."))] = "skip",
            payload: Payload = None, payload_base64: PayloadBase64 = None, content_type: ContentType = None,
            pool: PoolName = None, kind: Kind = None, priority: Priority = None,
            key: Annotated[str | None, Field(description=(
                "A key prefix: each occurrence's key is '<key>@<start time, RFC 3339 UTC>'."))] = None,
            tenant: Tenant = None,
            deadline_in: Annotated[float | None, Field(ge=0, description=(
                "A soft deadline, in seconds from each occurrence's start."))] = None,
            tolerance: Tolerance = None, on_miss: OnMiss = None, timeout: Timeout = None,
            duration_hint: DurationHint = None, retry: Retry = None, resources: Resources = None,
            tags: Tags = None, labels: Labels = None) -> ScheduleAdded:
        """Register a recurring schedule, or replace the one of the same name: each occurrence submits a task
        with these options at its cron time. Needs the admin role."""
        task = TaskInput(payload=payload, payload_base64=payload_base64, content_type=content_type, pool=pool,
                         kind=kind, priority=priority, key=key, tenant=tenant, deadline_in=deadline_in,
                         tolerance=tolerance, on_miss=on_miss, timeout=timeout, duration_hint=duration_hint,
                         retry=retry, resources=resources, tags=tags, labels=labels)
        options = checked(task)
        with calls():
            next_at = await client.add_recurring(name, cron, tz=tz, overlap=overlap, **options)
        return ScheduleAdded(name=name, next_at=_unix(next_at))

    @app.tool(annotations=_REMOVE)
    async def remove_schedule(name: ScheduleName) -> ScheduleRemoved:
        """Remove a recurring schedule (a task it already created still runs). Needs the admin role."""
        with calls():
            return ScheduleRemoved(name=name, removed=await client.remove_recurring(name))

    # ------------------------------------------------------------ resources

    @app.resource("cronoq://snapshot", name="snapshot", title="Snapshot", mime_type="application/json",
                  description="Every pool's capacity, load, backlog and waits, and the server's totals, "
                              "read live. Needs the metrics role.")
    async def snapshot_resource() -> str:
        with reads():
            return snapshot_view(await client.snapshot()).model_dump_json(indent=2)

    @app.resource("cronoq://pools/{pool}", name="pool", title="Pool", mime_type="application/json",
                  description="One pool: its snapshot (capacity, desired, busy, pending by class, waits) and "
                              "its connected workers, read live. Needs the metrics role.",
                  security=ResourceSecurity(exempt_params={"pool"}))
    async def pool_resource(pool: str) -> str:
        with reads():
            found = next((p for p in (await client.snapshot())["pools"] if p["name"] == pool), None)
            if found is None:
                raise ResourceNotFoundError(f"no pool named {pool!r} (or the token may not see it)")
            workers = await client.workers(pools=[pool])
        return PoolDetail(pool=pool_view(found), workers=[worker_view(w) for w in workers]).model_dump_json(indent=2)

    async def task_detail(ref: int | str) -> str:
        with reads():
            info = await client.get(ref)
            result = None
            if info.status in TERMINAL:
                result = result_view(await client.wait(info.id, 0))
        return TaskDetail(task=task_view(info), result=result).model_dump_json(indent=2)

    @app.resource("cronoq://tasks/{id}", name="task", title="Task by id", mime_type="application/json",
                  description="A task by id, and its result (output included) once it finished.")
    async def task_resource(id: str) -> str:
        if not id.isdigit() or int(id) <= 0:
            raise ResourceNotFoundError(f"{id!r} is not a task id (a positive integer); use cronoq://keys/{{key}}")
        return await task_detail(int(id))

    @app.resource("cronoq://keys/{key}", name="task_by_key", title="Task by key", mime_type="application/json",
                  description="A task by key (percent-encode '/' and other reserved characters), and its result "
                              "once it finished.", security=ResourceSecurity(exempt_params={"key"}))
    async def key_resource(key: str) -> str:
        return await task_detail(key)

    @app.resource("cronoq://schedules", name="schedules", title="Recurring schedules", mime_type="application/json",
                  description="The recurring schedules and their next occurrences. Needs the metrics role.")
    async def schedules_resource() -> str:
        with reads():
            schedules = await client.recurring()
        return ScheduleList(schedules=[schedule_view(s) for s in schedules],
                            unavailable_shards=list(schedules.unavailable_shards)).model_dump_json(indent=2)

    @app.resource("cronoq://workers", name="workers", title="Workers", mime_type="application/json",
                  description="The connected workers: pool, labels, slots, busy. Needs the metrics role.")
    async def workers_resource() -> str:
        with reads():
            workers = await client.workers()
        return WorkerList(workers=[worker_view(w) for w in workers],
                          unavailable_shards=list(workers.unavailable_shards)).model_dump_json(indent=2)

    @app.resource("cronoq://dead-letters", name="dead_letters", title="Recent dead letters",
                  mime_type="application/json",
                  description=f"The {RECENT_DEAD_LETTERS} most recent dead-lettered tasks (failed on their last "
                              "attempt), newest first, with their failure messages.")
    async def dead_letters_resource() -> str:
        recent: list[TaskInfo] = []
        scanned, after, complete = 0, 0, False
        with reads():
            for _ in range(DEAD_LETTER_PAGES):
                page = await client.list(statuses=["dead_lettered"], after=after, limit=1000)
                scanned += len(page.tasks)
                recent = (recent + page.tasks)[-RECENT_DEAD_LETTERS:]
                if page.next_after is None:
                    complete = True
                    break
                after = page.next_after
        return DeadLetters(tasks=[task_view(t) for t in reversed(recent)], scanned=scanned,
                           complete=complete).model_dump_json(indent=2)

    # ------------------------------------------------------------ completions

    async def complete(ref: PromptReference | ResourceTemplateReference, argument: CompletionArgument,
                       context: CompletionContext | None) -> Completion | None:
        """Suggestions for the 'pool' arguments (the server's pools) and 'tz' (IANA zones)."""
        if argument.name == "pool":
            try:
                names = [p["name"] for p in (await client.snapshot())["pools"]]
            except _CALL_ERRORS:
                return None   # a token without the metrics role: no suggestions, and no error for a hint
        elif argument.name == "tz":
            names = sorted(zoneinfo.available_timezones())
        else:
            return None
        matches = [name for name in names if name.startswith(argument.value)]
        return Completion(values=matches[:MAX_COMPLETIONS], total=len(matches),
                          has_more=len(matches) > MAX_COMPLETIONS)

    cast(Any, app).completion()(complete)   # (the SDK's decorator is untyped)

    if traces is not None:
        from .whatif import add_what_if
        add_what_if(app, traces)

    # ------------------------------------------------------------ prompts

    app.prompt(title="Triage the dead letters", description=(
        "Group the recent dead-lettered tasks by cause and propose what to resubmit or fix."))(
        prompts.triage_dead_letters)
    app.prompt(title="Why is this pool slow?", description=(
        "Find the bottleneck of a pool: workers, backlog, retries, resources, labels."))(prompts.why_is_pool_slow)
    app.prompt(title="Schedule a nightly job", description=(
        "Add a daily cron schedule at a given time, after checking the pool and the name."))(
        prompts.schedule_nightly_job)
    app.prompt(title="Drain a pool before maintenance", description=(
        "Stop new work reaching a pool and let what is there finish, asking before anything is removed."))(
        prompts.drain_pool)
    app.prompt(title="Run a batch of prompts at low priority", description=(
        "Submit many LLM prompts as one low-priority batch for cronoq-llm-worker, paced by the rate limits."))(
        prompts.llm_batch)
    return app


def _unix(seconds: float | None) -> _dt.datetime | None:
    return None if seconds is None else _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
