"""Core.explain: every reason a task waits, read from the engine's state, and
the place in line it reports matches the order the pool really dispatches in."""

import random

import pytest

from cronoq.core import Dep, Explanation, PoolConfig, ResourceConfig, RetryPolicy, TaskSpec, UnknownTask
from cronoq.core.explain import REASONS
from enginekit import S, dispatches, drain, make_core, occupy, run_to


def pool(**options):
    settings = dict(min=0, max=8, initial=1, autoscale=False)
    settings.update(options)
    return PoolConfig("default", **settings)


def submit(core, now, payload, **options):
    task_id = core.submit(now, TaskSpec(payload, **options))[0]
    core.check_invariants()
    return task_id


def codes(explanation):
    return [r.code for r in explanation.reasons]


def reason(explanation, code):
    [found] = [r for r in explanation.reasons if r.code == code]
    return found


def explained(core, ref, now=0):
    answer = core.explain(ref, now)
    core.check_invariants()   # (read-only: nothing moved)
    assert set(codes(answer)) <= set(REASONS)
    assert Explanation.from_dict(answer.as_dict()) == answer
    return answer


def test_an_unknown_task_is_unknown():
    core = make_core(pool())
    with pytest.raises(UnknownTask):
        core.explain(12345, 0)
    with pytest.raises(UnknownTask):
        core.explain("no-such-key", 0)


def test_running_and_ended_tasks_have_no_reasons():
    core = make_core(pool())
    lease = occupy(core)
    [running] = list(core.tasks)
    answer = explained(core, running)
    assert answer.status == "running" and answer.reasons == () and not answer.waiting
    core.complete(S, lease)
    drain(core)
    ended = explained(core, running, S)
    assert ended.status == "succeeded" and ended.reasons == () and "succeeded" in ended.summary


def test_a_blocked_task_names_each_unmet_dependency_and_its_condition():
    core = make_core(pool(initial=0))
    first = submit(core, 0, "a", key="a")
    second = submit(core, 0, "b", key="b")
    child = submit(core, 0, "c", after=["a"], deps=[Dep("b", on="complete")])
    answer = explained(core, child)
    assert answer.status == "blocked" and codes(answer) == ["dependencies"]
    unmet = reason(answer, "dependencies").detail["unmet"]
    assert [(d["id"], d["key"], d["status"], d["condition"]) for d in unmet] == [
        (first, "a", "ready", "success"), (second, "b", "ready", "complete")]


def test_a_met_dependency_is_no_longer_reported():
    core = make_core(pool())
    lease = occupy(core)
    submit(core, 0, "a", key="a")
    submit(core, 0, "b", key="b")
    child = submit(core, 0, "c", after=["a", "b"])
    core.complete(S, lease)
    [d] = dispatches(drain(core))   # "a" runs
    core.complete(2 * S, d.lease)
    drain(core)                     # "a" succeeded, "b" runs
    unmet = reason(explained(core, child, 2 * S), "dependencies").detail["unmet"]
    assert [u["key"] for u in unmet] == ["b"] and unmet[0]["status"] == "running"


def test_a_task_awaiting_a_key_says_which_and_for_how_long():
    core = make_core(pool(unknown_dependency="await", await_timeout=30))
    child = submit(core, 0, "c", after=["later"])
    answer = explained(core, child)
    assert codes(answer) == ["awaiting_key"]
    assert reason(answer, "awaiting_key").detail == {"keys": ["later"], "timeout_s": 30.0}
    submit(core, S, "p", key="later", priority="low")
    assert codes(explained(core, child, S)) == ["dependencies"]


def test_a_scheduled_task_reports_its_fixed_start_then_its_held_slot():
    core = make_core(pool(initial=2), max_hold=5)
    task = submit(core, 0, "job", start_in=60, tolerance=2)
    answer = explained(core, task)
    assert answer.status == "scheduled" and codes(answer) == ["start_time"]
    detail = reason(answer, "start_time").detail
    assert detail["kind"] == "fixed_start" and detail["at"] == 60.0 and detail["tolerance_s"] == 2.0
    run_to(core, 59 * S)   # within the hold lead (the tolerance): a slot is held
    assert codes(explained(core, task, 59 * S)) == ["start_time", "hold"]


def test_a_retrying_task_reports_when_its_backoff_ends():
    core = make_core(pool())
    task = submit(core, 0, "flaky", retry=RetryPolicy(max_attempts=3, initial_backoff=4, multiplier=1, jitter=False))
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "retryable")
    drain(core)
    answer = explained(core, task, 2 * S)
    assert answer.status == "retrying" and codes(answer) == ["start_time"]
    detail = reason(answer, "start_time").detail
    assert detail["kind"] == "retry" and detail["attempt"] == 1 and detail["at"] == 5.0


def test_labels_no_worker_carries_are_named():
    core = make_core(pool(initial=1))
    task = submit(core, 0, "gpu-job", labels={"gpu": "a100"})
    drain(core)
    answer = explained(core, task)
    # The pool has a free slot, but not one with these labels: it waits apart, not "next".
    assert answer.status == "ready" and codes(answer) == ["labels"]
    assert "carries the labels gpu=a100" in answer.reasons[0].message
    assert answer.reasons[0].detail["groups"] == [] and answer.reasons[0].detail["position"] == 1


def test_labels_whose_workers_are_all_busy_are_named():
    core = make_core(pool(initial=0))
    core.set_group_capacity(0, "default", {"gpu": "a100"}, 1)
    first = submit(core, 0, "one", labels={"gpu": "a100"})
    second = submit(core, 0, "two", labels={"gpu": "a100"})
    drain(core)
    assert explained(core, first).status == "running"
    answer = explained(core, second)
    assert "labels" in codes(answer) and "is busy" in reason(answer, "labels").message
    assert reason(answer, "labels").detail["groups"] == [{"labels": {"gpu": "a100"}, "capacity": 1, "busy": 1}]


def test_a_parked_task_names_the_resource_its_units_and_its_place():
    core = make_core(pool(initial=3), resources=[ResourceConfig.semaphore("gpu", 2)])
    submit(core, 0, "holder", resources={"gpu": 2})
    first = submit(core, 0, "w1", resources={"gpu": 1})
    second = submit(core, 0, "w2", resources={"gpu": 2})
    drain(core)
    answer = explained(core, second)
    assert answer.status == "ready" and codes(answer) == ["resource"]
    detail = reason(answer, "resource").detail
    assert detail["resource"] == "gpu" and detail["units"] == 2 and detail["available"] == 0
    assert detail["parked"] is True and detail["position"] == 2 and detail["waiting"] == 2
    assert reason(explained(core, first), "resource").detail["position"] == 1


def test_a_queued_task_in_a_full_pool_has_its_score_position_and_the_pool_figures():
    core = make_core(pool(initial=1))
    occupy(core)
    low = submit(core, 0, "low", priority="low")
    high = submit(core, 0, "high", priority="high")
    answer = explained(core, low, 10 * S)
    assert codes(answer) == ["pool_full"] and answer.position == 2 and answer.queued == 2
    assert reason(answer, "pool_full").detail == {"capacity": 1, "busy": 1, "held": 0, "desired": 1}
    top = explained(core, high, 10 * S)
    assert top.position == 1 and top.score == pytest.approx(1000 + 2.0 * 10)
    assert answer.score == pytest.approx(10 + 2.0 * 10)


def test_a_pool_without_workers_says_so():
    core = make_core(pool(initial=0))
    task = submit(core, 0, "job")
    answer = explained(core, task)
    assert codes(answer) == ["pool_full"] and "capacity is 0" in answer.reasons[0].message


def test_a_resource_a_queued_task_will_find_short_is_reported_before_it_parks():
    core = make_core(pool(initial=2), resources=[ResourceConfig.semaphore("db", 1)])
    submit(core, 0, "holder", resources={"db": 1})
    drain(core)                                  # "holder" runs with the unit
    occupy(core)                                 # and the other slot is taken
    task = submit(core, 0, "next", resources={"db": 1})
    answer = explained(core, task)
    assert codes(answer) == ["resource", "pool_full"]
    detail = reason(answer, "resource").detail
    assert detail["parked"] is False and detail["available"] == 0 and detail["units"] == 1


def test_a_tenant_over_its_share_waits_behind_the_others():
    core = make_core(pool(initial=1, fair_share=True))
    occupy(core)
    a = [submit(core, 0, "a", tenant="a") for _ in range(3)]
    b = submit(core, 0, "b", tenant="b")
    assert "fair_share" not in codes(explained(core, a[0]))
    second = explained(core, a[1])
    assert reason(second, "fair_share").detail["ahead"] == ["b"] and second.position == 3
    assert explained(core, b).position == 2


def test_a_ready_task_with_a_free_slot_is_next():
    core = make_core(pool(initial=1))
    core.stop_dispatching()   # (between a submission and its dispatch step, it waits for nothing)
    task = submit(core, 0, "job")
    answer = explained(core, task)
    assert codes(answer) == ["next"] and answer.position == 1


def test_explaining_changes_nothing():
    core = make_core(pool(initial=1), resources=[ResourceConfig.token_bucket("api", rate=1, burst=1)])
    occupy(core)
    task = submit(core, 0, "job", resources={"api": 1})
    before = (core.next_wakeup(), list(core.timer_heap), core.resources["api"].tokens, core.resources["api"].last)
    explained(core, task, 100 * S)
    assert (core.next_wakeup(), list(core.timer_heap), core.resources["api"].tokens,
            core.resources["api"].last) == before
    assert core.poll_action() is None


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fair", [False, True])
def test_positions_are_the_order_the_pool_dispatches_in(seed, fair):
    rng = random.Random(seed)
    core = make_core(pool(initial=1, fair_share=fair))
    lease = occupy(core)
    ids = []
    for _ in range(30):
        options = {"priority": rng.choice(["critical", "high", "normal", "low"]), "tenant": rng.choice("xyz")}
        if rng.random() < 0.3:
            options["deadline_in"] = rng.uniform(1, 400)
        ids.append(submit(core, rng.randrange(0, 50) * S if not ids else 50 * S, "t", **options))
    now = 300 * S
    predicted = sorted(ids, key=lambda i: core.explain(i, now).position)
    assert sorted(core.explain(i, now).position for i in ids) == list(range(1, 31))
    order = []
    for _ in ids:
        core.complete(now, lease)
        [d] = dispatches(drain(core))
        order.append(d.task_id)
        lease = d.lease
    assert order == predicted


def test_a_fixed_start_waiting_for_a_slot_to_hold_says_so():
    core = make_core(pool(initial=1))
    occupy(core)
    task = submit(core, 0, "job", start_in=10, tolerance=20)   # within its hold lead at once
    run_to(core, S)   # (the hold is checked on the timer armed for now)
    answer = explained(core, task, S)
    assert codes(answer) == ["start_time", "hold"] and reason(answer, "hold").detail == {"held": False}
    assert "no slot of its pool is free" in reason(answer, "hold").message


def test_a_label_waiter_in_a_pool_without_a_free_slot_reports_both():
    core = make_core(pool(initial=1))
    core.set_group_capacity(0, "default", {"gpu": "a100"}, 1)
    submit(core, 0, "gpu-1", labels={"gpu": "a100"})
    waiter = submit(core, 0, "gpu-2", labels={"gpu": "a100"})   # label-parked: its group is busy
    drain(core)
    occupy(core)                                                 # and the unlabeled slot is taken
    answer = explained(core, waiter)
    assert codes(answer) == ["labels", "pool_full"]
