"""Recording traces: TraceRecorder on live schedulers, and traces built from
a durable store's history (SQLite and PostgreSQL)."""

import asyncio
import io
import json
import time
import uuid

import pytest

import cronoq
from cronoq.core import NS
from cronoq.whatif import Report, Trace, TraceRecorder, simulate, trace_from_store, variants, replay


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.asyncio
async def test_refusals_batches_and_duplicates_are_recorded_as_they_happened(tmp_path):
    clock = cronoq.VirtualClock()
    release = asyncio.Event()

    async def slow(ctx, payload):
        await release.wait()

    path = tmp_path / "t.jsonl"
    sched = cronoq.Scheduler([fixed("app", slow, max_pending=2, overflow="reject")], clock=clock, seed=4)
    recorder = TraceRecorder(sched, path, sample_interval=0)
    async with sched:
        first = await sched.submit("one", key="one", priority="high", deadline_in=5.0)
        await clock.advance(1.0)
        await sched.submit("again", key="one")                     # a duplicate: no new task
        batch = await sched.submit_batch([cronoq.Task("a", key="a"), cronoq.Task("b", after="a")])
        with pytest.raises(cronoq.QueueFull):
            await sched.submit("too many", kind="extra")
        release.set()
        await first
    lines = records(path)
    header = lines[0]
    assert header["cronoq_trace"] == 1 and header["t0"] == clock.now() - 1.0
    assert header["policy"]["pools"]["app"]["max_pending"] == 2 and header["policy"]["seed"] == 4
    tasks = [line for line in lines if "task" in line]
    assert [t["task"] for t in tasks] == [first.id, batch[0].id, batch[1].id, "refused-1"]
    assert tasks[0]["deadline"] == 5.0 and tasks[0]["priority"] == "high" and tasks[0]["at"] == 0.0
    assert tasks[1]["batch"] == tasks[2]["batch"] and tasks[2]["deps"] == [["a", "success"]]
    assert tasks[1]["at"] == 1.0
    assert tasks[3]["kind"] == "extra" and tasks[3]["refused"].startswith("QueueFull: ")
    assert lines[-1]["end_of_trace"] is True and lines[-1]["dropped"] == 0
    assert "payload" not in json.dumps(lines)   # options only
    trace = Trace.load(path)
    assert trace.tasks[3].refused is not None
    assert Report(trace, []).live.endings["refused"] == 1


@pytest.mark.asyncio
async def test_a_submission_that_waited_for_room_is_recorded_when_it_arrived(tmp_path):
    clock = cronoq.VirtualClock()
    release = asyncio.Event()

    async def slow(ctx, payload):
        await release.wait()

    path = tmp_path / "t.jsonl"
    sched = cronoq.Scheduler([fixed("app", slow, max_pending=1, overflow="wait")], clock=clock)
    TraceRecorder(sched, path, sample_interval=0)
    async with sched:
        await sched.submit("running")
        await clock.settle()
        await sched.submit("queued")
        waiting = asyncio.create_task(sched.submit("late"))
        await clock.advance(3.0)
        release.set()
        await waiting
        await clock.settle()
    tasks = [line for line in records(path) if "task" in line]
    assert [t["at"] for t in tasks] == [0.0, 0.0, 0.0]   # the third arrived at 0, admitted at 3


@pytest.mark.asyncio
async def test_attempts_are_timed_with_their_outcomes_and_aborts(tmp_path):
    clock = cronoq.VirtualClock()

    async def work(ctx, payload):
        await clock.sleep(payload["sleep"])
        if payload.get("fail") == "retry" and ctx.attempt == 1:
            raise cronoq.Retryable("try again", retry_after=2.0)
        if payload.get("fail") == "permanent":
            raise cronoq.Permanent("no")
        return "ok"

    path = tmp_path / "t.jsonl"
    sched = cronoq.Scheduler([fixed("app", work, capacity=4)], clock=clock)
    recorder = TraceRecorder(sched, path, sample_interval=0)
    assert recorder.times_attempts
    async with sched:
        ok = await sched.submit({"sleep": 0.5})
        flaky = await sched.submit({"sleep": 0.25, "fail": "retry"})
        broken = await sched.submit({"sleep": 1.0, "fail": "permanent"})
        slow = await sched.submit({"sleep": 10.0}, timeout=2.0, retry=cronoq.RetryPolicy.none())
        queued = await sched.submit({"sleep": 1.0}, start_in=50.0)
        await clock.advance(1.0)
        await sched.cancel(queued.id)
        await clock.advance(10.0)
        for handle in (ok, flaky):
            await handle
    trace = Trace.load(path)
    by_id = {t.id: t for t in trace.tasks}
    runs = {handle.id: [(a.start, a.seconds, a.outcome, a.retry_after) for a in by_id[handle.id].attempts or []]
            for handle in (ok, flaky, broken, slow, queued)}
    assert runs[ok.id] == [(0.0, 0.5, "success", None)]
    assert runs[flaky.id] == [(0.0, 0.25, "retryable", 2.0), (2.25, 0.25, "success", None)]
    assert runs[broken.id] == [(0.0, 1.0, "permanent", None)]
    assert runs[slow.id] == [(0.0, 2.0, "aborted", None)]
    assert runs[queued.id] == []
    assert by_id[slow.id].status == "dead_lettered"
    assert by_id[queued.id].status == "cancelled" and by_id[queued.id].cancel_ns == NS   # a user's cancel
    result = replay(trace, variants(trace)[0])
    statuses = dict(zip((t.id for t in trace.tasks), result.status))
    assert statuses == {ok.id: "succeeded", flaky.id: "succeeded", broken.id: "failed", slow.id: "dead_lettered",
                        queued.id: "cancelled"}


@pytest.mark.asyncio
async def test_with_every_transition_a_recorder_made_on_a_running_scheduler_times_attempts(tmp_path):
    """No middleware once started: the attempts are timed from the RUNNING
    transition to the one that ends them, with the outcome it implies."""
    clock = cronoq.VirtualClock()

    async def work(ctx, payload):
        await clock.sleep(payload["sleep"])
        if payload.get("fail") == "retry" and ctx.attempt == 1:
            raise cronoq.Retryable("try again")
        if payload.get("fail") == "permanent":
            raise cronoq.Permanent("no")
        return "ok"

    path = tmp_path / "t.jsonl"
    sched = cronoq.Scheduler(
        [fixed("app", work, capacity=4, retry=cronoq.RetryPolicy(max_attempts=2, initial_backoff=1.0,
                                                                  jitter=False))],
        clock=clock, emit_transitions=True)
    async with sched:
        recorder = TraceRecorder(sched, path, sample_interval=0)
        assert recorder.times_attempts
        ok = await sched.submit({"sleep": 0.5})
        flaky = await sched.submit({"sleep": 0.25, "fail": "retry"})
        broken = await sched.submit({"sleep": 1.0, "fail": "permanent"})
        slow = await sched.submit({"sleep": 10.0}, timeout=2.0, retry=cronoq.RetryPolicy.none())
        running = await sched.submit({"sleep": 30.0})
        await clock.advance(5.0)
        await sched.cancel(running.id)
        await clock.advance(1.0)
        for handle in (ok, flaky):
            await handle
        recorder.close()
    trace = Trace.load(path)
    assert trace.meta["timed_attempts"] is True
    by_id = {t.id: t for t in trace.tasks}
    runs = {handle.id: [(a.start, a.seconds, a.outcome) for a in by_id[handle.id].attempts or []]
            for handle in (ok, flaky, broken, slow, running)}
    assert runs[ok.id] == [(0.0, 0.5, "success")]
    assert runs[flaky.id] == [(0.0, 0.25, "retryable"), (1.25, 0.25, "success")]
    assert runs[broken.id] == [(0.0, 1.0, "permanent")]
    assert runs[slow.id] == [(0.0, 2.0, "aborted")]         # the timeout, not the executor, ended it
    assert runs[running.id] == [(0.25, 4.75, "aborted")]    # (a slot freed at 0.25) cancelled while it ran
    result = replay(trace, variants(trace)[0])
    statuses = dict(zip((t.id for t in trace.tasks), result.status))
    assert statuses == {ok.id: "succeeded", flaky.id: "succeeded", broken.id: "failed",
                        slow.id: "dead_lettered", running.id: "cancelled"}


def test_threads_are_timed_and_a_late_recorder_records_without_times(tmp_path):
    def work(ctx, payload):
        if payload == "fail":
            raise cronoq.Permanent("no")
        return payload

    early = tmp_path / "early.jsonl"
    late = tmp_path / "late.jsonl"
    sched = cronoq.BlockingScheduler([fixed("app", work, capacity=2)])
    first = TraceRecorder(sched, early, sample_interval=0)
    with sched:
        second = TraceRecorder(sched, late, sample_interval=0)
        assert not second.times_attempts
        handles = [sched.submit(x) for x in ("a", "fail", "b")]
        for handle in handles:
            try:
                handle.result(timeout=10)
            except cronoq.TaskFailed:
                pass
        second.close()
        second.close()   # twice: nothing more
    for path, timed in ((early, True), (late, False)):
        trace = Trace.load(path)
        assert [t.id for t in trace.tasks] == [h.id for h in handles]
        assert [t.status for t in trace.tasks] == ["succeeded", "failed", "succeeded"]
        outcomes = [[a.outcome for a in t.attempts or []] for t in trace.tasks]
        assert outcomes == ([["success"], ["permanent"], ["success"]] if timed else [[], [], []])
        assert trace.meta["timed_attempts"] is timed
    assert not first.recording


@pytest.mark.asyncio
async def test_the_recorder_samples_the_pools_and_writes_to_a_file_object(tmp_path):
    clock = cronoq.VirtualClock()

    async def work(ctx, payload):
        await clock.sleep(1.0)

    out = io.StringIO()
    sched = cronoq.Scheduler([cronoq.Pool("app", work, min=1, max=4,
                                          autoscale=cronoq.AutoscaleConfig(cost_per_worker_second=1.0))],
                             clock=clock)
    recorder = TraceRecorder(sched, out, flush_interval=0.01, sample_interval=0.01)
    async with sched:
        for _ in range(8):
            await sched.enqueue(None)
        deadline = time.monotonic() + 30
        while '"sample"' not in out.getvalue() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)   # (real time: the writer thread samples)
        await clock.advance(5.0)
        await asyncio.sleep(0.05)
        recorder.close()
    trace = Trace.loads(out.getvalue())
    assert trace.samples and set(trace.samples[0][1]) == {"app"}
    assert trace.meta["usage"]["worker_seconds"] >= 0
    assert not out.closed   # the caller's file stays open


@pytest.mark.asyncio
async def test_a_full_buffer_drops_records_and_says_so(tmp_path):
    async def work(ctx, payload):
        return None

    path = tmp_path / "t.jsonl"
    sched = cronoq.Scheduler([fixed("app", work, capacity=0)])
    recorder = TraceRecorder(sched, path, max_buffer=3, flush_interval=60, sample_interval=0)
    async with sched:
        for _ in range(10):
            await sched.enqueue(None)
        recorder.close()
    trace = Trace.load(path)
    assert recorder.dropped > 0 and trace.meta["dropped"] == recorder.dropped
    assert "recorder dropped" in " ".join(Report(trace, []).notes())
    with pytest.raises(ValueError, match="max_buffer must be an integer >= 1"):
        TraceRecorder(sched, tmp_path / "x.jsonl", max_buffer=0)
    with pytest.raises(TypeError, match="expected a cronoq.Scheduler"):
        TraceRecorder(object(), tmp_path / "x.jsonl")


# ---------------------------------------------------------------- from a store


async def _durable_run(store):
    async def work(ctx, payload):
        await asyncio.sleep(0.002)
        if payload == "fail":
            raise cronoq.Permanent("no")
        if payload == "flaky" and ctx.attempt == 1:
            raise cronoq.Retryable("again")
        return payload

    pools = [cronoq.Pool("app", work, min=2, max=2, autoscale=False,
                         retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False))]
    sched = cronoq.Scheduler(pools, store=store)
    async with sched:
        handles = [await sched.submit(f"job{i}", kind="job", priority="high", deadline_in=30.0) for i in range(6)]
        handles += [await sched.submit("fail", kind="broken"), await sched.submit("flaky", kind="flaky")]
        later = await sched.submit("later", kind="job", start_in=3600.0)
        await sched.cancel(later.id)
        for handle in handles:
            try:
                await handle
            except cronoq.TaskFailed:
                pass
    return sched, handles, later


def _check_store_trace(trace, handles, later):
    by_id = {t.id: t for t in trace.tasks}
    assert [t.id for t in trace.tasks] == [h.id for h in handles] + [later.id]
    assert trace.meta["durations_estimated"] is True and trace.kind_durations["job"] > 0
    assert [a.outcome for a in by_id[handles[6].id].attempts] == ["permanent"]
    assert [a.outcome for a in by_id[handles[7].id].attempts] == ["retryable", "success"]
    assert all(a.seconds is None for t in trace.tasks for a in t.attempts or [])
    assert by_id[later.id].cancel_ns is not None and by_id[later.id].spec.start_at_ns is not None
    assert by_id[handles[0].id].spec.deadline_at_ns - trace.t0_ns - by_id[handles[0].id].at_ns == 30 * NS


@pytest.mark.asyncio
async def test_a_trace_built_from_a_sqlite_store_replays(tmp_path):
    db = tmp_path / "state.db"
    store = cronoq.SqliteStore(db)
    try:
        sched, handles, later = await _durable_run(store)
    finally:
        await store.close()
    trace = await asyncio.to_thread(trace_from_store, str(db), policy=sched)
    _check_store_trace(trace, handles, later)
    assert trace.policy["pools"]["app"]["max"] == 2
    same = await asyncio.to_thread(trace_from_store, f"sqlite:///{db}")
    assert [t.id for t in same.tasks] == [t.id for t in trace.tasks] and same.policy is None
    report = simulate(trace)
    fig = report.variants[0]
    assert fig.endings["succeeded"] == 7 and fig.endings["failed"] == 1 and fig.endings["cancelled"] == 1
    assert fig.modelled_attempts == 9    # no run time in a store: the estimates
    with pytest.raises(ValueError, match="no SQLite file"):
        trace_from_store(str(tmp_path / "missing.db"))
    with pytest.raises(ValueError, match="store must be a SqliteStore"):
        trace_from_store("mysql://nowhere")


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_a_trace_built_from_a_postgres_store_replays(pg_server):
    from storekit import POSTGRES_FAST

    store = cronoq.PostgresStore(pg_server.url, schema=f"w_{uuid.uuid4().hex[:10]}", **POSTGRES_FAST)
    try:
        sched, handles, later = await _durable_run(store)
        trace = await asyncio.to_thread(trace_from_store, store, policy=sched)
    finally:
        await store.close()
    _check_store_trace(trace, handles, later)
    assert simulate(trace).variants[0].endings["succeeded"] == 7
