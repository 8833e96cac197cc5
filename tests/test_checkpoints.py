"""Checkpointed stages: a task declares its stages, its executor saves a
checkpoint per stage, and a retry runs only the stages earlier attempts did
not finish. Here without a store, and the limits; the durable side is in
test_checkpoints_durable.py."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from cronoq.core.types import MAX_STAGES

pytestmark = pytest.mark.asyncio

STAGES = ["chunk", "embed", "index"]
FAST_RETRY = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)


class Pipeline:
    """A three-stage executor that skips the stages already checkpointed and
    fails in ``fail_in`` on its first attempt."""

    def __init__(self, fail_in: str | None = "index") -> None:
        self.fail_in = fail_in
        self.ran: list[tuple[int, str]] = []       # (attempt, stage) of every stage run
        self.seen: list[tuple[int, str | None, list[str]]] = []   # (attempt, resumed_from, completed)

    async def __call__(self, ctx: cronoq.TaskContext, payload):
        self.seen.append((ctx.attempt, ctx.resumed_from, ctx.completed_stages))
        for stage in STAGES:
            if stage in ctx.checkpoints:
                continue
            self.ran.append((ctx.attempt, stage))
            if stage == self.fail_in and ctx.attempt == 1:
                raise RuntimeError(f"{stage} failed")
            await ctx.checkpoint(stage, {"done": stage, "n": len(ctx.completed_stages)})
        return ctx.checkpoints


def staged_pool(executor, **options) -> cronoq.Pool:
    return cronoq.Pool("default", executor, min=2, max=2, retry=FAST_RETRY, **options)


async def test_a_retry_runs_only_the_stage_that_failed():
    work = Pipeline(fail_in="index")
    async with cronoq.Scheduler([staged_pool(work)]) as sched:
        handle = await sched.submit({"doc": 42}, stages=STAGES)
        result = await asyncio.wait_for(handle, 10)
        info = await sched.info(handle.id)
    assert work.ran == [(1, "chunk"), (1, "embed"), (1, "index"), (2, "index")]
    assert work.seen == [(1, None, []), (2, "embed", ["chunk", "embed"])]
    assert result == {"chunk": {"done": "chunk", "n": 0}, "embed": {"done": "embed", "n": 1},
                      "index": {"done": "index", "n": 2}}
    assert info.status == "succeeded" and info.stages == STAGES
    assert [(c.stage, c.attempt) for c in info.checkpoints] == [("chunk", 1), ("embed", 1), ("index", 2)]
    assert all(c.at > 0 and c.size > 0 for c in info.checkpoints)
    assert info.checkpoints[0].at <= info.checkpoints[1].at <= info.checkpoints[2].at


async def test_plain_functions_checkpoint_from_their_thread():
    ran: list[tuple[int, str]] = []

    def pipeline(ctx: cronoq.TaskContext, payload):
        for stage in STAGES:
            if stage in ctx.checkpoints:
                continue
            ran.append((ctx.attempt, stage))
            if stage == "embed" and ctx.attempt == 1:
                raise RuntimeError("embed failed")
            saved = ctx.checkpoint_from_thread(stage, stage.upper())
            assert saved.stage == stage and saved.data == stage.upper()
        return ctx.resumed_from

    with cronoq.BlockingScheduler([staged_pool(pipeline)]) as sched:
        handle = sched.submit(None, stages=STAGES)
        assert handle.result(timeout=10) == "chunk"
    assert ran == [(1, "chunk"), (1, "embed"), (2, "embed"), (2, "index")]


async def test_saving_a_stage_again_replaces_its_checkpoint_and_counts_one():
    async def twice(ctx, payload):
        await ctx.checkpoint("chunk", 1)
        await ctx.checkpoint("chunk", 2)
        return ctx.checkpoints

    async with cronoq.Scheduler([staged_pool(twice)]) as sched:
        handle = await sched.submit(None, stages=STAGES)
        assert await handle == {"chunk": 2}
        info = await sched.info(handle.id)
        assert [(c.stage, c.data) for c in info.checkpoints] == [("chunk", 2)]
        snap = await sched.snapshot()
        assert snap.checkpoints == {"tasks": 1, "held": 1, "saved": 2}


async def test_a_checkpoint_is_a_copy_made_by_the_codec():
    async def mutate(ctx, payload):
        data = {"items": [1, 2]}
        await ctx.checkpoint("chunk", data)
        data["items"].append(3)   # after the save: not in the checkpoint
        return ctx.checkpoints["chunk"]

    async with cronoq.Scheduler([staged_pool(mutate)]) as sched:
        assert await (await sched.submit(None, stages=STAGES)) == {"items": [1, 2]}


async def test_tasks_without_declared_stages_may_checkpoint_any_stage_in_save_order():
    async def free(ctx, payload):
        assert ctx.stages is None
        await ctx.checkpoint("b", 1)
        await ctx.checkpoint("a", 2)
        return ctx.completed_stages

    async with cronoq.Scheduler([staged_pool(free)]) as sched:
        handle = await sched.submit(None)
        assert await handle == ["b", "a"]
        assert (await sched.info(handle.id)).stages is None


# ---------------------------------------------------------------- limits


async def run_one(executor, **options):
    async with cronoq.Scheduler([cronoq.Pool("default", executor)], **options) as sched:
        return await (await sched.submit(None, stages=STAGES))


async def refused(action, **options) -> str:
    async def executor(ctx, payload):
        with pytest.raises(cronoq.CheckpointError) as caught:
            await action(ctx)
        assert ctx.checkpoints == {}   # nothing was saved
        return str(caught.value)

    return await run_one(executor, **options)


async def test_an_undeclared_stage_is_refused_naming_the_declared_ones():
    message = await refused(lambda ctx: ctx.checkpoint("rerank", 1))
    assert "'rerank'" in message and "'chunk', 'embed', 'index'" in message


async def test_a_checkpoint_beyond_the_size_limit_is_refused_naming_its_size_and_the_limit():
    message = await refused(lambda ctx: ctx.checkpoint("chunk", "x" * 200), max_checkpoint_bytes=100)
    assert "'chunk'" in message and "202 bytes" in message and "100 bytes" in message


async def test_data_the_codec_cannot_encode_is_refused_naming_the_stage():
    message = await refused(lambda ctx: ctx.checkpoint("chunk", object()))
    assert "'chunk'" in message and "cannot be encoded" in message


async def test_a_stage_name_must_be_a_non_empty_string():
    assert "stage must not be empty" in await refused(lambda ctx: ctx.checkpoint("", 1))
    assert "stage must be a string" in await refused(lambda ctx: ctx.checkpoint(3, 1))


async def test_undeclared_stages_are_limited_in_number():
    async def many(ctx, payload):
        for i in range(MAX_STAGES):
            await ctx.checkpoint(f"s{i}", i)
        with pytest.raises(cronoq.CheckpointError, match=f"{MAX_STAGES} stages, the limit"):
            await ctx.checkpoint("one-more", 0)
        await ctx.checkpoint("s0", "again")   # an existing stage may still be saved again
        return len(ctx.checkpoints)

    async with cronoq.Scheduler([cronoq.Pool("default", many)]) as sched:
        assert await (await sched.submit(None)) == MAX_STAGES


async def test_an_attempt_that_was_given_up_cannot_save():
    ctx_box: list[cronoq.TaskContext] = []
    release = asyncio.Event()

    async def slow(ctx, payload):
        ctx_box.append(ctx)
        await release.wait()

    async with cronoq.Scheduler([cronoq.Pool("default", slow)]) as sched:
        handle = await sched.submit(None, stages=STAGES)
        while not ctx_box:
            await asyncio.sleep(0.005)
        await sched.cancel(handle.id)
        with pytest.raises(cronoq.CheckpointError, match="is over"):
            await ctx_box[0].checkpoint("chunk", 1)
        assert (await sched.info(handle.id)).checkpoints == []


async def test_the_async_form_from_a_thread_and_the_thread_form_on_the_loop_say_which_to_use():
    async def on_loop(ctx, payload):
        with pytest.raises(cronoq.SchedulerError, match="await ctx.checkpoint"):
            ctx.checkpoint_from_thread("chunk", 1)
        return "ok"

    def on_thread(ctx, payload):
        with pytest.raises(cronoq.SchedulerError, match="checkpoint_from_thread"):
            ctx.checkpoint("chunk", 1)
        return "ok"

    assert await run_one(on_loop) == "ok"
    assert await run_one(on_thread) == "ok"


@pytest.mark.parametrize("stages, error", [
    ("chunk", "must be a list"),
    ([], "at least one stage"),
    (["a", "a"], "names 'a' twice"),
    (["a", ""], r"stages\[1\] must not be empty"),
    (["a", 3], r"stages\[1\] must be a string"),
    ([f"s{i}" for i in range(MAX_STAGES + 1)], f"the limit is {MAX_STAGES}"),
    (["x" * 300], r"stages\[0\] is 300 bytes"),
])
async def test_invalid_declared_stages_are_refused_at_submission(stages, error):
    async with cronoq.Scheduler([cronoq.Pool("default", Pipeline())]) as sched:
        with pytest.raises(cronoq.InvalidTask, match=error):
            await sched.submit(None, stages=stages)
        assert (await sched.snapshot()).totals["submitted"] == 0


# ---------------------------------------------------------------- events and retention


async def test_events_mark_each_stage_completed_with_transitions_on():
    work = Pipeline(fail_in="index")
    async with cronoq.Scheduler([staged_pool(work)], emit_transitions=True) as sched:
        events = sched.events()
        handle = await sched.submit(None, stages=STAGES)
        await handle
        seen = []
        async for event in events:
            seen.append(event)
            if event.status == "succeeded":
                break
    stages = [(e.stage, e.attempt, e.status) for e in seen if e.stage is not None]
    assert stages == [("chunk", 1, "running"), ("embed", 1, "running"), ("index", 2, "running")]
    assert all(e.message == f"stage {e.stage!r} completed" for e in seen if e.stage is not None)


async def test_without_transitions_only_terminal_events_go_out():
    async with cronoq.Scheduler([staged_pool(Pipeline(fail_in=None))]) as sched:
        events = sched.events()
        await (await sched.submit(None, stages=STAGES))
        first = await asyncio.wait_for(events.__anext__(), 5)
        assert first.status == "succeeded" and first.stage is None


async def test_checkpoints_go_with_the_task_at_retention():
    clock = cronoq.VirtualClock()
    config = cronoq.core.CoreConfig(retention=60.0)
    async with cronoq.Scheduler([staged_pool(Pipeline(fail_in=None))], clock=clock, config=config) as sched:
        handle = await sched.submit(None, stages=STAGES)
        await handle
        assert len((await sched.info(handle.id)).checkpoints) == 3
        assert (await sched.snapshot()).checkpoints["tasks"] == 1
        await clock.advance(61)
        assert (await sched.snapshot()).checkpoints == {"tasks": 0, "held": 0, "saved": 3}
        with pytest.raises(cronoq.UnknownTask):
            await sched.info(handle.id)


async def test_a_recurring_template_keeps_its_stages():
    work = Pipeline(fail_in=None)
    clock = cronoq.VirtualClock()
    async with cronoq.Scheduler([staged_pool(work)], clock=clock) as sched:
        await sched.add_recurring("ingest", "* * * * *", None, stages=STAGES)
        await clock.advance(61)
        while not work.ran:
            await asyncio.sleep(0.005)
    assert work.ran[0] == (1, "chunk")


async def test_the_stage_option_is_in_the_task_signature_and_kept_as_a_tuple():
    import inspect
    assert "stages" in inspect.signature(cronoq.Task).parameters
    task = cronoq.Task(None, stages=["a", "b"])
    assert task.stages == ("a", "b") and not task.plain


async def test_prometheus_counts_checkpoints_saved_and_tasks_holding_them():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from cronoq.telemetry import PrometheusCollector

    async with cronoq.Scheduler([staged_pool(Pipeline(fail_in="index"))]) as sched:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(sched))
        await (await sched.submit(None, stages=STAGES))
        await (await sched.submit(None, stages=STAGES))
        samples = {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
                   for s in f.samples}
    assert samples["cronoq_checkpoints_saved_total"] == 6
    assert samples["cronoq_checkpointed_tasks"] == 2
