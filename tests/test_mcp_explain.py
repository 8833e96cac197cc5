"""explain_task's reasoning without a server: the score formula of
docs/concepts.md, the queue position, and the reason given for each way a
task can wait; plus the conversions of results and errors for the agent."""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("mcp")

from cronoq import errors  # noqa: E402
from cronoq.client import AccessDenied, ServerError, TaskInfo, TaskResult  # noqa: E402
from cronoq.mcp.explain import Memory, Remembered, explain, score  # noqa: E402
from cronoq.mcp.models import TaskInput, result_view  # noqa: E402
from cronoq.mcp.server import describe_error, remembered, task_options  # noqa: E402

NOW = 1_800_000_000.0


def info(id: int = 1, status: str = "ready", pool: str = "p", priority: str = "normal", created: float = NOW,
         attempt: int = 0, message: str | None = None) -> TaskInfo:
    return TaskInfo(id, status, pool, None, "default", attempt, 3, message, False, priority, None, {}, created,
                    None, None)


def pool(capacity: int = 2, busy: int = 0, held: int = 0, desired: int | None = None, groups=None, **extra) -> dict:
    figures = dict(name="p", capacity=capacity, busy=busy, held=held,
                   desired=capacity if desired is None else desired, pending=1,
                   pending_by_class={"critical": 0, "high": 0, "normal": 1, "low": 0}, reservations=0, dispatched=0,
                   succeeded=0, failed=0, priority_adherence=1.0, fixed_start_hit_rate=1.0, utilization=0.0,
                   schedule_efficiency=1.0, wait_p50_s=0.0, wait_p90_s=0.0, wait_p99_s=0.0, cost=0.0,
                   workers_connected=1, groups=groups if groups is not None else [
                       {"labels": {}, "capacity": capacity, "busy": busy}])
    figures.update(extra)
    return figures


def test_the_score_follows_the_published_formula():
    # docs/concepts.md: base 10000/1000/100/10, 2 points a second of age up to 800.
    assert score("normal", NOW, NOW) == 100
    assert score("low", NOW - 20, NOW) == 50
    assert score("low", NOW - 400, NOW) == 810 == score("low", NOW - 4000, NOW)
    assert score("critical", NOW - 1, NOW) == 10002
    assert score("normal", None, NOW) == 100
    # Urgency: 0 beyond the horizon max(d, 5 s), 5000 at the latest start, then +100 a second up to +3000.
    assert score("low", NOW, NOW, deadline=NOW + 100, duration=1) == 10
    assert score("low", NOW, NOW, deadline=NOW + 1, duration=1) == 5010
    assert score("low", NOW, NOW, deadline=NOW + 1 + 2.5, duration=1) == 10 + 2500
    assert score("low", NOW, NOW, deadline=NOW - 9, duration=1) == 10 + 5000 + 1000
    assert score("low", NOW, NOW, deadline=NOW - 1000, duration=1) == 10 + 8000
    # Without a duration estimate, the pool's default of 1 s.
    assert score("low", NOW, NOW, deadline=NOW + 1) == 5010


def test_the_position_counts_the_ready_tasks_that_score_higher():
    ready = [info(1, priority="low", created=NOW - 400), info(2, priority="normal", created=NOW),
             info(3, priority="normal", created=NOW - 10), info(4, priority="high", created=NOW),
             info(5, priority="normal", created=NOW)]
    positions = {t.id: explain(t, now=NOW, ready=ready, pool=pool(busy=2)).position for t in ready}
    # high (1000) > aged low (810) > older normal (120) > normals of equal score, the first submitted first.
    assert positions == {4: 1, 1: 2, 3: 3, 2: 4, 5: 5}
    memory = Memory()
    memory.remember(5, Remembered(deadline=NOW + 0.5))   # overdue for a 1 s estimate: ahead of all of them
    assert explain(ready[4], now=NOW, ready=ready, pool=pool(busy=2), memory=memory).position == 1


@pytest.mark.parametrize("figures,known,expected", [
    (pool(capacity=0, desired=3), None, "No worker serves pool p: its capacity is 0 (desired 3)."),
    (pool(groups=[{"labels": {"gpu": "a100"}, "capacity": 2, "busy": 0}]), Remembered(labels={"gpu": "h100"}),
     "No connected worker of pool p carries the labels gpu=h100."),
    (pool(busy=1, held=1), None, "All 2 slots of pool p are busy (1 held for fixed starts); 0 ready tasks of its "
                                 "pool score higher."),
    (pool(busy=1), Remembered(resources={"gpu": 1}),
     "Pool p has 1 free slot, so it is most likely parked on a resource: it needs gpu=1 and other tasks hold the "
     "units."),
    (pool(busy=0), None, "Pool p has 2 free slots: it should start at the next dispatch."),
    (pool(groups=[{"labels": {"gpu": "a100", "zone": "eu"}, "capacity": 2, "busy": 0}]),
     Remembered(labels={"gpu": "a100"}), "Pool p has 2 free slots: it should start at the next dispatch."),
])
def test_a_ready_task_is_explained_by_its_pool(figures, known, expected):
    memory = Memory()
    task = info()
    if known is not None:
        memory.remember(task.id, known)
    explanation = explain(task, now=NOW, pool=figures, ready=[task], memory=memory)
    assert explanation.waiting is True
    assert explanation.summary == expected
    assert explanation.score == 100 and explanation.position == 1 and explanation.ready_in_pool == 1
    assert bool(explanation.unknown[0].startswith("its deadline")) == (known is None)


def test_a_pool_short_of_workers_says_so():
    explanation = explain(info(), now=NOW, pool=pool(capacity=2, busy=2, desired=5), ready=[info()])
    assert "pool p wants 5 slots but has 2: it needs more workers" in explanation.reasons
    assert "pool p is full: 2 busy of 2" in explanation.reasons
    assert explanation.pool is not None and explanation.pool.desired == 5


def test_blocked_scheduled_retrying_running_and_finished_tasks():
    memory = Memory()
    memory.remember(1, Remembered(deps=(("extract", "success"), (7, "complete"), ("gone", "failure"))))
    blocked = explain(info(1, "blocked"), now=NOW, memory=memory,
                      dependency_status={"extract": "running", 7: "succeeded", "gone": None})
    assert blocked.summary == "It is blocked on 2 unfinished dependencies."
    assert [d.model_dump() for d in blocked.dependencies] == [
        {"task": "extract", "on": "success", "status": "running"},
        {"task": 7, "on": "complete", "status": "succeeded"},
        {"task": "gone", "on": "failure", "status": None}]
    assert blocked.reasons[:2] == ["it waits for task 'extract' to succeed (now running)",
                                   "it waits for task 'gone' to finish (now unknown to the server)"]
    assert "dependency 7 finished as succeeded (condition: complete)" in blocked.reasons
    released = explain(info(1, "blocked"), now=NOW, memory=memory,
                       dependency_status={"extract": "succeeded", 7: "failed", "gone": "failed"})
    assert "every dependency has finished" in released.summary
    assert explain(info(2, "blocked"), now=NOW).reasons == ["which dependencies is not shown by the API"]

    memory.remember(3, Remembered(start=NOW + 90))
    assert explain(info(3, "scheduled"), now=NOW, memory=memory).summary == (
        "It has a fixed start at 2027-01-15 08:01:30 UTC, in 90.0 s.")
    assert explain(info(3, "scheduled"), now=NOW + 7200, memory=memory).summary.endswith("ago: it starts at once.")
    assert explain(info(4, "scheduled"), now=NOW).summary == "It has a fixed start that has not come yet."

    retrying = explain(info(5, "retrying", attempt=2, message="timeout"), now=NOW, pool=pool(capacity=0))
    assert retrying.summary == "Attempt 2 of 3 failed (timeout); it waits out the retry backoff before the next " \
                               "attempt."
    assert "no worker serves pool p now (capacity 0)" in retrying.reasons
    running = explain(TaskInfo(6, "running", "p", None, "default", 1, 3, None, False, "normal", None, {}, NOW,
                               NOW + 1, None), now=NOW)
    assert running.waiting is False and running.summary.startswith("It is not waiting: attempt 1 of 3 is running")
    finished = explain(info(7, "dead_lettered", message="gave up after 3 attempts"), now=NOW)
    assert finished.summary == "It is not waiting: it finished as dead_lettered (gave up after 3 attempts)."
    assert finished.score is None and finished.position is None


def test_without_the_metrics_role_the_explanation_says_what_is_missing():
    explanation = explain(info(), now=NOW, pool_error="PERMISSION_DENIED: needs metrics", ready=[info()])
    assert explanation.pool is None
    assert "its pool's capacity and backlog: PERMISSION_DENIED: needs metrics" in explanation.unknown
    assert explanation.summary.startswith("It is ready (normal, score 100) and waits for a free slot")


def test_memory_keeps_the_most_recent_tasks():
    memory = Memory(capacity=2)
    for task in (1, 2, 3):
        memory.remember(task, Remembered(labels={"n": str(task)}))
    assert memory.get(1) is None and memory.get(3) is not None and memory.get(3).labels == {"n": "3"}


def test_remembered_options_turn_relative_times_absolute():
    task = TaskInput(deadline_in=30, start_in=10, after=["a", 3], deps=[{"task": "b", "on": "failure"}],
                     resources={"gpu": 1}, labels={"zone": "eu"}, duration_hint=2)
    kept = remembered(task, NOW)
    assert (kept.deadline, kept.start, kept.duration_hint) == (NOW + 30, NOW + 10, 2)
    assert kept.deps == (("a", "success"), (3, "success"), ("b", "failure"))
    assert task_options(TaskInput(payload_base64=base64.b64encode(b"\x00\x01").decode()))["payload"] == b"\x00\x01"
    with pytest.raises(ValueError, match="not both"):
        task_options(TaskInput(payload=1, payload_base64="AA=="))


def test_results_show_json_text_and_binary_outputs():
    assert result_view(TaskResult(1, "succeeded", b'{"a": 1}', "application/json", None, True)).output == {"a": 1}
    assert result_view(TaskResult(1, "succeeded", b'[1]', "application/problem+json", None, True)).output == [1]
    text = result_view(TaskResult(1, "succeeded", "é".encode(), "text/plain; charset=utf-8", None, True))
    assert (text.output, text.output_base64) == ("é", None)
    binary = result_view(TaskResult(1, "succeeded", b"\xff\x00", "", None, True))
    assert (binary.output, binary.output_base64, binary.content_type) == (None, "/wA=", "application/octet-stream")
    broken = result_view(TaskResult(1, "succeeded", b"{not json", "application/json", None, True))
    assert (broken.output, broken.output_base64) == (None, base64.b64encode(b"{not json").decode())
    failed = result_view(TaskResult(2, "failed", None, "", "boom", False))
    assert (failed.ok, failed.message, failed.content_type, failed.output) == (False, "boom", None, None)


@pytest.mark.parametrize("exc,code", [
    (AccessDenied("PERMISSION_DENIED", "needs the admin role"), "PERMISSION_DENIED"),
    (ServerError("ALREADY_EXISTS", "key held"), "ALREADY_EXISTS"),
    (errors.UnknownTask("no task with id 9"), "NOT_FOUND"),
    (errors.UnknownPool("no pool"), "NOT_FOUND"),
    (errors.QueueFull("full"), "RESOURCE_EXHAUSTED"),
    (errors.ReservationConflict("no capacity"), "RESOURCE_EXHAUSTED"),
    (errors.Cycle("a cycle"), "INVALID_ARGUMENT"),
    (errors.InvalidTask("bad"), "INVALID_ARGUMENT"),
    (TimeoutError("still running"), "DEADLINE_EXCEEDED"),
    (errors.SchedulerError("not the leader"), "UNAVAILABLE"),
])
def test_errors_name_the_servers_status_code(exc, code):
    found, message = describe_error(exc, "h:1")
    assert found == code and code in message
    if code == "UNAVAILABLE":
        assert "does not retry" in message and "h:1" in message
    else:
        assert message.startswith(f"cronoq-server refused the call: {code}: ")
    unreachable = describe_error(errors.SchedulerError("failed to connect to all addresses"), "h:1")[1]
    assert unreachable.startswith("cannot reach cronoq-server at h:1")
