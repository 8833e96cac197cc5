"""Submitting work and looking at it: handles, batches, cancel, info,
snapshots, capacity, task options, exceptions."""

import asyncio
import datetime
import pickle

import pytest

import cronoq


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def echo(ctx, payload):
    return payload


async def failure(handle):
    with pytest.raises(cronoq.TaskFailed) as info:
        await handle
    return info.value


class Gate:
    """An async executor whose tasks wait for ``release`` (payload "block")."""

    def __init__(self):
        self.release = asyncio.Event()
        self.started = []
        self.first_started = asyncio.Event()

    async def __call__(self, ctx, payload):
        self.started.append(payload)
        self.first_started.set()
        if payload == "block" or (isinstance(payload, dict) and payload.get("block")):
            await self.release.wait()
        return payload


# ---------------------------------------------------------------- submit and handles


@pytest.mark.asyncio
async def test_submit_returns_an_awaitable_handle():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        handle = await sched.submit({"doc": 1}, key="doc-1")
        assert isinstance(handle, cronoq.TaskHandle)
        assert isinstance(handle.id, int) and handle.id > 0
        assert (handle.key, handle.duplicate) == ("doc-1", False)
        assert await handle == {"doc": 1}
        # awaiting again gives the same value; the handle reports it is done
        assert await handle == {"doc": 1}
        assert handle.done() is True
        assert handle.status == "succeeded"
        assert handle.result() == {"doc": 1}
        other = await sched.submit(2)
        assert other.id > handle.id and other.key is None
        assert await other == 2


@pytest.mark.asyncio
async def test_handle_result_before_it_finishes_raises_invalid_state():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        handle = await sched.submit("block")
        assert handle.done() is False and handle.status is None
        with pytest.raises(asyncio.InvalidStateError):
            handle.result()
        gate.release.set()
        assert await handle == "block"


@pytest.mark.asyncio
async def test_cancelling_an_await_on_a_handle_does_not_cancel_the_task():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        handle = await sched.submit("block")
        waiter = asyncio.get_running_loop().create_task(asyncio.wait_for(handle, 10))
        await asyncio.wait_for(gate.first_started.wait(), 5)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (await sched.info(handle.id)).status == "running"
        gate.release.set()
        assert await handle == "block"


@pytest.mark.asyncio
async def test_a_timed_out_wait_for_on_a_handle_leaves_it_usable():
    clock = cronoq.VirtualClock()

    async def run(ctx, payload):
        await clock.sleep(10.0)
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        handle = await sched.submit("v")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(handle, 0.001)   # a real-time timeout while virtual time stands still
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(handle, 0.001)
        await clock.advance(10.0)
        assert await handle == "v"


@pytest.mark.asyncio
async def test_cancelling_one_awaiter_does_not_affect_the_others():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        handle = await sched.submit("block")
        loop = asyncio.get_running_loop()

        async def wait():
            return await handle

        awaiters = [loop.create_task(wait()) for _ in range(3)]
        await asyncio.wait_for(gate.first_started.wait(), 5)
        awaiters[1].cancel()
        gate.release.set()
        results = await asyncio.gather(*awaiters, return_exceptions=True)
    assert results[0] == results[2] == "block"
    assert isinstance(results[1], asyncio.CancelledError)


@pytest.mark.asyncio
async def test_payload_objects_are_passed_and_returned_as_is():
    sentinel = object()

    async def identity(ctx, payload):
        return payload, sentinel

    async with cronoq.Scheduler([fixed("default", identity)]) as sched:
        payload = {"not": {"json", "able"}}
        got, marker = await (await sched.submit(payload))
    assert got is payload and marker is sentinel


@pytest.mark.asyncio
async def test_failed_task_raises_task_failed_with_fields():
    async def run(ctx, payload):
        raise cronoq.Permanent(f"bad {payload}")

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        handle = await sched.submit(7)
        err = await failure(handle)
        # the handle keeps the failure: awaiting again raises the same
        err2 = await failure(handle)
    assert (err.status, err.message, err.task_id) == ("failed", "bad 7", handle.id)
    assert (err2.status, err2.message, err2.task_id) == ("failed", "bad 7", handle.id)
    assert handle.status == "failed"
    assert str(handle.id) in str(err) and "failed" in str(err) and "bad 7" in str(err)


@pytest.mark.asyncio
async def test_duplicate_key_while_live_returns_the_same_task():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        first = await sched.submit("block", key="same")
        second = await sched.submit("other payload", key="same")
        assert (second.id, second.key, second.duplicate) == (first.id, "same", True)
        gate.release.set()
        assert await first == "block"
        assert await second == "block"
        snap = await sched.snapshot()
    assert gate.started == ["block"]
    assert snap.totals["submitted"] == 1


@pytest.mark.asyncio
async def test_duplicate_key_after_finish_returns_the_cached_output():
    calls = []

    async def run(ctx, payload):
        calls.append(payload)
        return payload * 10

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        assert await (await sched.submit(1, key="k")) == 10
        dup = await sched.submit(2, key="k")
        assert dup.duplicate is True and dup.done() is True
        assert await dup == 10
    assert calls == [1]


@pytest.mark.asyncio
async def test_enqueue_returns_the_id_without_a_handle():
    seen = []

    async def run(ctx, payload):
        seen.append((ctx.id, payload))
        return payload

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        first = await sched.enqueue("a", key="ka")
        second = await sched.enqueue("b")
        assert isinstance(first, int) and second > first
        assert sched._driver.results.handles == {}       # no handle was made
        assert await (await sched.handle(second)) == "b"
        assert await (await sched.handle("ka")) == "a"
    assert seen == [(first, "a"), (second, "b")]


# ---------------------------------------------------------------- handle(key)


@pytest.mark.asyncio
async def test_handle_on_a_live_task():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        original = await sched.submit("block", key="live")
        by_key = await sched.handle("live")
        by_id = await sched.handle(original.id)
        assert (by_key.id, by_key.key) == (original.id, "live")
        assert by_id.id == original.id
        assert not by_key.done()
        gate.release.set()
        assert [await original, await by_key, await by_id] == ["block"] * 3


@pytest.mark.asyncio
async def test_handle_on_a_finished_task_gets_the_cached_output():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        assert await (await sched.submit({"v": 1}, key="done")) == {"v": 1}
        later = await sched.handle("done")
        assert later.done() and later.key == "done"
        assert await later == {"v": 1}


@pytest.mark.asyncio
async def test_handle_on_a_failed_or_cancelled_task_raises_its_failure():
    gate = Gate()

    async def run(ctx, payload):
        if payload == "bad":
            raise cronoq.Permanent("nope")
        return await gate(ctx, payload)

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        await failure(await sched.submit("bad", key="bad"))
        blocker = await sched.submit("block")
        await sched.enqueue("queued", key="queued")
        await sched.cancel("queued")
        err = await failure(await sched.handle("bad"))
        err2 = await failure(await sched.handle("queued"))
        gate.release.set()
        await blocker
    assert (err.status, err.message) == ("failed", "nope")
    assert err2.status == "cancelled"


@pytest.mark.asyncio
async def test_output_cache_zero_still_delivers_to_handles_held_while_the_task_ran():
    async with cronoq.Scheduler([fixed("default", echo)], output_cache=0) as sched:
        live = await sched.submit(5, key="k")
        # a handle held while the task ran gets the output: the cache is only for later handles
        assert await live == 5
        later = await failure(await sched.handle("k"))
        dup = await sched.submit(6, key="k")
        err_dup = await failure(dup)
        info = await sched.info("k")
    for e in (later, err_dup):
        assert e.status == "succeeded"
        assert "output" in e.message and "no longer available" in e.message and "output_cache" in e.message
        assert e.task_id == live.id
    assert dup.duplicate and info.status == "succeeded"


@pytest.mark.asyncio
async def test_output_unavailable_once_evicted_from_the_cache():
    async with cronoq.Scheduler([fixed("default", echo)], output_cache=2) as sched:
        for i in range(3):
            assert await (await sched.submit(i, key=f"k{i}")) == i
        err = await failure(await sched.handle("k0"))
        assert await (await sched.handle("k1")) == 1
        assert await (await sched.handle("k2")) == 2
        dup = await sched.submit(99, key="k0")
        err_dup = await failure(dup)
    assert err.status == "succeeded" and "no longer available" in err.message
    assert dup.duplicate is True and err_dup.status == "succeeded"


@pytest.mark.asyncio
async def test_handle_and_info_of_unknown_task_raise_unknown_task():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        for call in (sched.handle, sched.info, sched.cancel):
            with pytest.raises(cronoq.UnknownTask) as info:
                await call("nope")
            assert info.value.ref == "nope"
            assert isinstance(info.value, LookupError)
        with pytest.raises(cronoq.UnknownTask):
            await sched.info(12345)


# ---------------------------------------------------------------- info


@pytest.mark.asyncio
async def test_info_reports_status_attempt_and_message():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        running = await sched.submit("block", key="r", kind="report", pool="default")
        queued = await sched.submit("q")
        await asyncio.wait_for(gate.first_started.wait(), 5)
        r = await sched.info("r")
        q = await sched.info(queued.id)
        assert (r.id, r.status, r.pool, r.key, r.kind, r.attempt, r.message) == \
            (running.id, "running", "default", "r", "report", 1, None)
        assert (q.id, q.status, q.key, q.attempt) == (queued.id, "ready", None, 0)
        gate.release.set()
        await running
        await queued
        done = await sched.info("r")
    assert (done.status, done.attempt) == ("succeeded", 1)
    assert done.as_dict()["status"] == "succeeded"


# ---------------------------------------------------------------- batches


@pytest.mark.asyncio
async def test_submit_batch_with_dependencies_runs_in_order():
    order = []

    async def run(ctx, payload):
        order.append(payload)
        if payload == "load":
            raise cronoq.Permanent("load failed")
        return payload.upper()

    pool = fixed("default", run, capacity=4)
    async with cronoq.Scheduler([pool]) as sched:
        handles = await sched.submit_batch([
            cronoq.Task("alert", deps=[cronoq.Dep("load", on="failure")]),
            cronoq.Task("load", key="load", after="transform"),
            cronoq.Task("transform", key="transform", after=["extract"]),
            cronoq.Task("extract", key="extract"),
            cronoq.Task("report", deps=cronoq.Dep("load", on="success")),
        ])
        assert [h.key for h in handles] == [None, "load", "transform", "extract", None]
        assert all(not h.duplicate for h in handles)
        assert len({h.id for h in handles}) == 5
        alert, load, transform, extract, report = handles
        assert await alert == "ALERT"
        assert await extract == "EXTRACT"
        assert await transform == "TRANSFORM"
        assert (await failure(load)).status == "failed"
        assert (await failure(report)).status == "skipped"
    assert order == ["extract", "transform", "load", "alert"]


@pytest.mark.asyncio
async def test_enqueue_batch_returns_ids_in_order():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        ids = await sched.enqueue_batch([cronoq.Task(i, key=f"b{i}") for i in range(5)])
        assert ids == sorted(ids) and len(set(ids)) == 5
        assert [await (await sched.handle(f"b{i}")) for i in range(5)] == list(range(5))
        assert [(await sched.info(i)).key for i in ids] == [f"b{i}" for i in range(5)]


@pytest.mark.asyncio
@pytest.mark.parametrize("method", ["submit_batch", "enqueue_batch"])
async def test_batches_are_atomic_and_name_the_offending_index(method):
    ran = []

    async def run(ctx, payload):
        ran.append(payload)
        return payload

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        before = (await sched.snapshot()).totals["submitted"]
        with pytest.raises(cronoq.UnknownPool) as info:
            await getattr(sched, method)([
                cronoq.Task("a", key="a"),
                cronoq.Task("b", key="b", after="a"),
                cronoq.Task("c", pool="missing"),
            ])
        assert info.value.index == 2
        assert "task 2" in str(info.value)
        with pytest.raises(cronoq.Cycle) as cycle:
            await getattr(sched, method)([
                cronoq.Task("x", key="x", after="z"),
                cronoq.Task("y", key="y", after="x"),
                cronoq.Task("z", key="z", after="y"),
            ])
        assert cycle.value.index in (0, 1, 2)
        with pytest.raises(cronoq.UnknownDependency) as unknown:
            await getattr(sched, method)([cronoq.Task("ok"), cronoq.Task("bad", after="never-heard-of")])
        assert unknown.value.index == 1
        snap = await sched.snapshot()
        assert snap.totals["submitted"] == before
        assert snap.live_tasks == 0
        for key in ("a", "b", "x", "y", "z"):
            with pytest.raises(cronoq.UnknownTask):
                await sched.info(key)
        # the keys are still free
        assert await (await sched.submit("a again", key="a")) == "a again"
    assert ran == ["a again"]


@pytest.mark.asyncio
async def test_batches_take_only_task_objects():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        with pytest.raises(TypeError, match="item 1"):
            await sched.submit_batch([cronoq.Task(1), "not a task"])
        assert (await sched.snapshot()).totals["submitted"] == 0
        assert await sched.submit_batch([]) == []


@pytest.mark.asyncio
async def test_batch_duplicate_of_existing_key_is_marked():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        assert await (await sched.submit("first", key="k")) == "first"
        handles = await sched.submit_batch([cronoq.Task("again", key="k"), cronoq.Task("new", key="n")])
        assert [h.duplicate for h in handles] == [True, False]
        assert [await h for h in handles] == ["first", "new"]


# ---------------------------------------------------------------- cancel


@pytest.mark.asyncio
async def test_cancel_queued_task_by_id_and_key_and_dependents_are_skipped():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        blocker = await sched.submit("block")
        by_id = await sched.submit("q1")
        by_key = await sched.submit("q2", key="q2")
        child = await sched.submit("child", after="q2")
        on_complete = await sched.submit("cleanup", deps=[cronoq.Dep("q2", on="complete")])
        assert await sched.cancel(by_id.id) is True
        assert await sched.cancel("q2") is True
        assert await sched.cancel("q2") is False      # already cancelled
        e1, e2, e3 = await failure(by_id), await failure(by_key), await failure(child)
        gate.release.set()
        assert await blocker == "block"
        assert await on_complete == "cleanup"
        assert await sched.cancel(blocker.id) is False  # already finished
        snap = await sched.snapshot()
    assert (e1.status, e2.status, e3.status) == ("cancelled", "cancelled", "skipped")
    assert gate.started == ["block", "cleanup"]
    assert snap.totals["cancelled"] == 2 and snap.totals["skipped"] == 1


@pytest.mark.asyncio
async def test_cancel_a_fixed_start_task_before_it_starts():
    clock = cronoq.VirtualClock()
    async with cronoq.Scheduler([fixed("default", echo)], clock=clock) as sched:
        handle = await sched.submit("later", start_in=60.0)
        assert (await sched.info(handle.id)).status == "scheduled"
        assert await sched.cancel(handle.id) is True
        await clock.advance(120)
        assert (await failure(handle)).status == "cancelled"


# ---------------------------------------------------------------- snapshot and capacity


@pytest.mark.asyncio
async def test_snapshot_pools_and_totals():
    clock = cronoq.VirtualClock()

    async def run(ctx, payload):
        await clock.sleep(1.0)
        if payload == "bad":
            raise cronoq.Permanent("bad")
        return payload

    pools = [fixed("main", run, capacity=2), fixed("side", echo)]
    async with cronoq.Scheduler(pools, clock=clock) as sched:
        handles = [await sched.submit(i, pool="main", priority=p)
                   for i, p in enumerate(["high", "normal", "low", "low", "normal"])]
        snap = await sched.snapshot()
        main = snap.pool("main")
        assert [p.name for p in snap.pools] == ["main", "side"]
        assert (main.name, main.capacity, main.busy, main.pending) == ("main", 2, 2, 3)
        assert main.pending_by_class == {"critical": 0, "high": 0, "normal": 1, "low": 2}
        assert (snap.running, snap.pending, snap.live_tasks) == (2, 3, 5)
        assert snap.totals["submitted"] == 5 and snap.totals["dispatched"] == 2
        assert snap.pool("side").busy == 0
        with pytest.raises(KeyError):
            snap.pool("nope")
        bad = await sched.submit("bad", pool="main")
        await clock.advance(3.0)
        assert [await h for h in handles] == [0, 1, 2, 3, 4]
        await failure(bad)
        snap = await sched.snapshot()
    main = snap.pool("main")
    assert (main.busy, main.pending, main.dispatched, main.succeeded, main.failed) == (0, 0, 6, 5, 1)
    assert snap.totals["succeeded"] == 5 and snap.totals["failed"] == 1
    assert snap.totals["submitted"] == 6
    assert set(snap.totals) >= {"submitted", "dispatched", "succeeded", "failed", "dead_lettered",
                                "cancelled", "skipped", "missed", "shed", "retries", "timeouts",
                                "lease_expiries", "stale_completions", "recurring_conflicts",
                                "recurring_invalid"}
    assert snap.at == pytest.approx(clock.now())
    # snapshots pickle (for multiprocessing and the like)
    copy = pickle.loads(pickle.dumps(snap))
    assert copy == snap and copy.pool("main").succeeded == 5


@pytest.mark.asyncio
async def test_set_capacity_starts_more_tasks_at_once():
    gate = Gate()
    pool = cronoq.Pool("default", gate, min=1, max=3, initial=1, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        handles = [await sched.submit({"block": True, "i": i}) for i in range(5)]
        assert (await sched.snapshot()).pool("default").busy == 1
        await sched.set_capacity("default", 3)
        snap = await sched.snapshot()
        assert (snap.pool("default").capacity, snap.pool("default").busy) == (3, 3)
        assert snap.pending == 2
        await sched.set_capacity("default", 1)
        assert (await sched.snapshot()).pool("default").capacity == 1
        gate.release.set()
        results = [await h for h in handles]
        with pytest.raises(ValueError, match="nope"):
            await sched.set_capacity("nope", 1)
        with pytest.raises(ValueError):
            await sched.set_capacity("default", -1)
    assert [r["i"] for r in results] == [0, 1, 2, 3, 4]


@pytest.mark.asyncio
async def test_set_group_capacity_with_labels():
    ran = []

    async def run(ctx, payload):
        ran.append((payload, ctx.group))
        return payload

    pool = cronoq.Pool("gpu", run, min=1, max=3, initial=1, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        labelled = await sched.submit("needs a100", labels={"model": "a100"})
        plain = await sched.submit("anywhere")
        assert await plain == "anywhere"
        assert not labelled.done()
        assert (await sched.info(labelled.id)).status == "ready"
        await sched.set_group_capacity("gpu", {"model": "a100"}, 2)
        assert await labelled == "needs a100"
        snap = await sched.snapshot()
    groups = {tuple(sorted(g.labels.items())): g.capacity for g in snap.pool("gpu").groups}
    assert groups[(("model", "a100"),)] == 2
    assert groups[()] == 1
    assert ran == [("anywhere", {}), ("needs a100", {"model": "a100"})]


# ---------------------------------------------------------------- task options


@pytest.mark.asyncio
async def test_every_task_option_is_accepted_by_submit_enqueue_and_task():
    clock = cronoq.VirtualClock()
    seen = []

    async def run(ctx, payload):
        seen.append((payload, ctx.kind, ctx.key, ctx.tags, ctx.timeout, ctx.group, clock.now()))
        return payload

    pools = [cronoq.Pool("default", run, min=4, max=5, initial=4, autoscale=False)]
    resources = [cronoq.Resource.semaphore("llm-api", 2)]
    async with cronoq.Scheduler(pools, resources, clock=clock) as sched:
        await sched.set_group_capacity("default", {"zone": "eu"}, 1)
        t0 = clock.now()
        start_at = datetime.datetime.fromtimestamp(t0 + 30, tz=datetime.timezone.utc)
        assert await (await sched.submit("fetch", key="fetch:42")) == "fetch"
        options = dict(
            pool="default", kind="summarize", priority=cronoq.Priority.HIGH, deadline_in=30.0,
            duration_hint=2.0, timeout=60.0,
            retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.5),
            resources={"llm-api": 1}, after=["fetch:42"], deps=[cronoq.Dep("fetch:42", on="complete")],
            tolerance=2.0, on_miss="skip", tenant="acme", labels={"zone": "eu"}, tags={"team": "ml"},
        )
        h1 = await sched.submit("one", key="one", start_in=10.0, **options)
        id2 = await sched.enqueue("two", key="two", start_at=start_at, **options)
        [h3] = await sched.submit_batch([cronoq.Task(
            "three", key="three", deadline_at=t0 + 100, priority="critical", start_at=t0 + 50,
            **{k: v for k, v in options.items() if k not in ("deadline_in", "priority")})])
        # fixed starts wait for their time
        assert (await sched.info("one")).status == "scheduled"
        await clock.advance(60)
        assert await h1 == "one"
        assert await (await sched.handle(id2)) == "two"
        assert await h3 == "three"
    by_payload = {s[0]: s for s in seen}
    for name, start in (("one", t0 + 10), ("two", t0 + 30), ("three", t0 + 50)):
        payload, kind, key, tags, timeout, group, at = by_payload[name]
        assert (kind, key, tags, timeout, group) == ("summarize", name, {"team": "ml"}, 60.0, {"zone": "eu"})
        assert at == pytest.approx(start)


@pytest.mark.asyncio
async def test_priorities_order_a_backlog():
    gate = Gate()
    async with cronoq.Scheduler([fixed("default", gate)]) as sched:
        blocker = await sched.submit("block")
        handles = [await sched.submit(p, priority=p) for p in ("low", "normal", "high", "critical")]
        handles.append(await sched.submit("enum-high", priority=cronoq.Priority.HIGH))
        gate.release.set()
        await blocker
        for h in handles:
            await h
    assert gate.started == ["block", "critical", "high", "enum-high", "normal", "low"]


@pytest.mark.asyncio
@pytest.mark.parametrize("options, field", [
    (dict(deadline_in=-1.0), "deadline_in"),
    (dict(timeout=float("nan")), "timeout"),
    (dict(start_in=1.0, start_at=5.0), "start"),
    (dict(priority="urgent"), "priority"),
    (dict(on_miss="later"), "on_miss"),
    (dict(key="nul\x00key"), "key"),
    (dict(resources={"x": 0}), "resources"),
])
async def test_invalid_task_options_raise_invalid_task(options, field):
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        with pytest.raises(cronoq.InvalidTask, match=field) as info:
            await sched.submit(1, **options)
        assert isinstance(info.value, ValueError)
        with pytest.raises(cronoq.InvalidTask):
            await sched.enqueue(1, **options)
        with pytest.raises(cronoq.InvalidTask):
            cronoq.Task(1, **options)
        assert (await sched.snapshot()).totals["submitted"] == 0


@pytest.mark.asyncio
async def test_unknown_option_and_unknown_resource():
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        with pytest.raises(TypeError):
            await sched.submit(1, colour="blue")
        with pytest.raises(cronoq.UnknownResource):
            await sched.submit(1, resources={"gpu": 1})


@pytest.mark.asyncio
async def test_resources_limit_concurrency_across_pools():
    running = 0
    peak = 0
    release = asyncio.Event()
    two_running = asyncio.Event()

    async def run(ctx, payload):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            two_running.set()
        await release.wait()
        running -= 1
        return payload

    pools = [fixed("a", run, capacity=3), fixed("b", run, capacity=3)]
    async with cronoq.Scheduler(pools, [cronoq.Resource.semaphore("db", 2)]) as sched:
        handles = [await sched.submit(i, pool="ab"[i % 2], resources={"db": 1}) for i in range(6)]
        await asyncio.wait_for(two_running.wait(), 5)
        snap = await sched.snapshot()
        assert snap.running == 2 and snap.pending == 4
        release.set()
        assert [await h for h in handles] == list(range(6))
        with pytest.raises(cronoq.ResourceExceedsCapacity):
            await sched.submit(0, pool="a", resources={"db": 3})
    assert peak == 2


# ---------------------------------------------------------------- exceptions


EXCEPTIONS = [
    cronoq.CronoqError("base"),
    cronoq.SchedulerError("not running"),
    cronoq.TaskFailed("dead_lettered", "gave up", 17),
    cronoq.TaskFailed("shutdown"),
    cronoq.Retryable("rate limited", retry_after=2.5),
    cronoq.Retryable(),
    cronoq.Permanent("bad request"),
    cronoq.EventsLagged(12),
    cronoq.UnknownTask("key-1"),
    cronoq.UnknownTask(5),
    cronoq.AdmissionError("refused", 3),
    cronoq.ReservationConflict("full", 1),
    cronoq.Cycle("a -> b -> a", 0),
    cronoq.UnknownDependency("missing parent", 2),
    cronoq.UnknownPool("no pool", None),
    cronoq.UnknownResource("no resource", 4),
    cronoq.ResourceExceedsCapacity("too many", 0),
    cronoq.QueueFull("full", 9),
    cronoq.InvalidTask("timeout must be >= 0"),
]

FIELDS = ("status", "message", "task_id", "retry_after", "skipped", "ref", "index")


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: type(e).__name__)
def test_exceptions_pickle_with_type_and_fields(exc):
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert copy.args == exc.args
    for field in FIELDS:
        assert getattr(copy, field, "absent") == getattr(exc, field, "absent")
    assert isinstance(copy, cronoq.CronoqError)


def test_exception_hierarchy():
    for cls in (cronoq.ReservationConflict, cronoq.Cycle, cronoq.UnknownDependency, cronoq.UnknownPool,
                cronoq.UnknownResource, cronoq.ResourceExceedsCapacity, cronoq.QueueFull,
                cronoq.InvalidTask):
        assert issubclass(cls, cronoq.AdmissionError)
    assert issubclass(cronoq.InvalidTask, ValueError)
    for cls in (cronoq.SchedulerError, cronoq.TaskFailed, cronoq.Retryable, cronoq.Permanent,
                cronoq.EventsLagged, cronoq.UnknownTask, cronoq.AdmissionError):
        assert issubclass(cls, cronoq.CronoqError)
    err = cronoq.TaskFailed("failed", "boom", 3)
    assert (err.status, err.message, err.task_id) == ("failed", "boom", 3)
    lagged = cronoq.EventsLagged(4)
    assert lagged.skipped == 4


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_exception_is_in_cronoq_and_in_cronoq_errors():
    import cronoq.errors

    exported = {name for name in cronoq.__all__
                if isinstance(obj := getattr(cronoq, name), type) and issubclass(obj, BaseException)}
    assert exported == set(cronoq.errors.__all__)
    for name in exported:
        assert getattr(cronoq.errors, name) is getattr(cronoq, name), name
    # Every error class cronoq defines is exported (not only the ones listed above).
    defined = {cls.__name__ for cls in _all_subclasses(cronoq.CronoqError)
               if cls.__module__.startswith("cronoq.")}
    assert defined <= exported, defined - exported
    assert {"StoreUnavailable", "Fenced"} <= exported
    for exc in (cronoq.errors.StoreUnavailable("the store is unavailable"),
                cronoq.errors.Fenced("epoch 3 was replaced by epoch 4")):
        assert isinstance(exc, cronoq.SchedulerError)
        test_exceptions_pickle_with_type_and_fields(exc)


@pytest.mark.asyncio
async def test_task_failed_raised_by_a_handle_pickles():
    async def run(ctx, payload):
        raise cronoq.Permanent("nope")

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        err = await failure(await sched.submit())
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.status, copy.message, copy.task_id) == \
        (cronoq.TaskFailed, "failed", "nope", err.task_id)
