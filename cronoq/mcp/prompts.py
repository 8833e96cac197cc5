"""Ready workflows for an agent: each prompt is a user message naming the
steps, the tools and the resources to use. They change nothing themselves."""

from __future__ import annotations

import re
from typing import Annotated

from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from pydantic import Field

__all__ = ["triage_dead_letters", "why_is_pool_slow", "schedule_nightly_job", "drain_pool", "llm_batch"]


def triage_dead_letters(
        pool: Annotated[str, Field(description="Only this pool; empty for every pool.")] = "",
        limit: Annotated[str, Field(description="How many recent dead letters to look at (default 20).")] = "20",
) -> str:
    scope = f"pool {pool}" if pool else "every pool"
    return f"""Triage the recent dead-lettered tasks of cronoq ({scope}).

A dead-lettered task failed on its last allowed attempt; nothing will run it again unless someone resubmits it.

1. Read the resource cronoq://dead-letters (or call list_tasks with statuses=["dead_lettered"]{
        f', pools=["{pool}"]' if pool else ''}) and take the {limit} most recent.
2. Group them by pool, kind and failure message. For each group, call get_task on one or two of them for the
   attempts used and the times.
3. Decide for each group whether the failure is transient (a timeout, "worker disconnected", a lease that
   expired, an overloaded dependency) or permanent (bad input, a bug in the worker, a missing resource).
4. Report a table: group, count, first and last failure, likely cause, recommended action (resubmit, fix the
   input, fix the worker, raise timeout or retry.max_attempts).
5. Do not resubmit anything yet. List the submit_task calls you would make for transient failures, with the
   same pool, kind, priority and payload, and a new key, and ask me to confirm them first."""


def why_is_pool_slow(pool: Annotated[str, Field(description="The pool to investigate.")]) -> str:
    return f"""Find out why pool {pool} of cronoq is slow, and what would fix it.

1. Read cronoq://pools/{pool}: compare capacity with desired (desired above capacity means it needs more
   workers), busy with capacity (a full pool), pending and pending_by_class (the backlog and who is in it),
   wait_p50_s / wait_p90_s / wait_p99_s (how long tasks waited), utilization and priority_adherence.
2. Read cronoq://workers: how many workers serve {pool}, their slots, how busy they are, and their labels
   (tasks with labels only run on workers carrying them).
3. Call list_tasks with pools=["{pool}"] and statuses=["ready"], then ["running"], then ["retrying"]: is the
   backlog one kind, one tenant, one class? Are tasks failing and retrying?
4. Pick the two or three oldest ready tasks and call explain_task on each: it tells their score and place in
   the queue, and whether they wait for a slot, for labels no worker has, or for a resource.
5. Answer: the bottleneck (too few workers, slow tasks, retries, a resource, a label mismatch, one tenant
   flooding the pool), the figures that show it, and the change you recommend (more workers or slots, a
   higher max, fewer retries, fair share...). Change nothing yourself."""


_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


def schedule_nightly_job(
        name: Annotated[str, Field(description="The schedule's name (unique).")],
        what: Annotated[str, Field(description="What the job does, in words, and its input if any.")],
        time: Annotated[str, Field(description="The time of day, HH:MM (default 02:00).")] = "02:00",
        tz: Annotated[str, Field(description="IANA time zone (default UTC).")] = "UTC",
        pool: Annotated[str, Field(description="The pool that runs it; empty for the default pool.")] = "",
) -> str:
    match = _TIME.match(time.strip())
    if match is None:
        # (an MCPError reaches the client as it is; other exceptions lose their message)
        raise MCPError(code=INVALID_PARAMS, message=f"time must be HH:MM (24-hour clock), got {time!r}")
    hour, minute = int(match.group(1)), int(match.group(2))
    cron = f"{minute} {hour} * * *"
    return f"""Set up a nightly cronoq job named {name!r}: {what}

1. Call list_schedules and check that no schedule is already named {name!r} (add_schedule replaces one of the
   same name); if one is, show it to me and stop.
2. Call snapshot and check that pool {pool or '(the default pool)'} exists and has workers (workers_connected).
3. Call add_schedule with name={name!r}, cron="{cron}" (every day at {hour:02d}:{minute:02d}), tz={tz!r}{
        f', pool={pool!r}' if pool else ''}, overlap="skip" (a night's run is skipped while the previous one
   still runs), a payload describing the job's input, a timeout suited to the job and, if it must be done by
   morning, deadline_in (seconds from its start).
4. Call list_schedules again and report the schedule and its next_at, the next run, in {tz}.
Adding schedules needs the admin role: if the server refuses with PERMISSION_DENIED, say so and stop."""


def drain_pool(pool: Annotated[str, Field(description="The pool to drain.")]) -> str:
    return f"""Prepare pool {pool} of cronoq for maintenance: let it run empty without losing work.

This gateway cannot stop workers or close a pool; draining means stopping new work from arriving and letting
what is there finish. Report each step; ask me before anything that cancels or removes.

1. Read cronoq://pools/{pool} and cronoq://workers: note capacity, busy, pending, and the workers serving it.
2. Call list_schedules: the schedules whose pool is {pool} keep adding tasks. List them (name, cron, tz,
   next_at). Their payloads are not shown by the API, so removing one loses its definition: ask me before
   calling remove_schedule, and write down what is needed to add it back.
3. Call list_tasks with pools=["{pool}"] and the statuses ready, blocked, scheduled and retrying: these are still
   to run. Fixed starts (scheduled) that fall inside the maintenance window will run late or be missed:
   list them with explain_task.
4. Wait for running tasks: call wait_task on each running task (a timeout of a few minutes), or read
   cronoq://pools/{pool} until busy is 0.
5. Tell me when the pool is idle (busy 0 and nothing pending), or which tasks remain, and that the workers
   can now be stopped (a worker given SIGTERM finishes its tasks and disconnects)."""


def llm_batch(
        prompts: Annotated[str, Field(description="The prompts, one a line.")],
        pool: Annotated[str, Field(description="The pool cronoq-llm-worker serves (default llm).")] = "llm",
        model: Annotated[str, Field(description="The model; empty for the worker's default.")] = "",
) -> str:
    lines = [line.strip() for line in prompts.splitlines() if line.strip()]
    listed = "\n".join(f"- {line}" for line in lines)
    model_part = f', "model": "{model}"' if model else ""
    return f"""Run this batch of {len(lines)} prompts through cronoq's LLM worker at low priority.

{listed}

1. Call snapshot (or read cronoq://pools/{pool}) to check that pool {pool} exists and has workers; if no worker
   serves it, stop and tell me: nothing would run.
2. Call submit_batch with one task per prompt: pool "{pool}", kind "llm.chat", priority "low", payload
   {{"prompt": <the prompt>{model_part}}}, a key per prompt (e.g. its line number and a short hash) so a repeat
   does not run it twice, and, if the server has requests- or tokens-per-minute resources for the provider
   (snapshot lists resources), resources naming them (1 request, and the prompt's characters / 4 + max_tokens
   tokens): quota then waits in the queue instead of failing.
3. Low priority lets interactive chat go first; do not raise it. Follow the tasks with list_tasks
   (pools=["{pool}"]) and wait_task; a task that failed permanently names the provider's message.
4. Report a table: prompt, status, the first line of the text, tokens used, cost; and the totals."""
