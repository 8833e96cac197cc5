"""Worker labels: groups per exact label set, placement of labelled tasks, and
waiting without blocking the pool."""

import pytest

from cronoq.core import PoolConfig, TaskSpec
from enginekit import S, aborts, dispatches, drain, make_core, raises_wrong_type, run_to

GPU = {"gpu": "a100"}
GPU_EU = {"gpu": "a100", "zone": "eu"}
T4 = {"gpu": "t4"}


def labelled_core(unlabeled=1):
    core = make_core(PoolConfig("default", min=0, max=20, initial=unlabeled, autoscale=False))
    return core


def set_group(core, now, labels, n):
    core.set_group_capacity(now, "default", labels, n)
    core.check_invariants()
    return drain(core)


def submit(core, now, payload, **options):
    task_id = core.submit(now, TaskSpec(payload, **options))[0]
    core.check_invariants()
    return task_id


def finish(core, now, lease):
    assert core.complete(now, lease)
    core.check_invariants()
    return drain(core)


def groups(core, now=0):
    snap = core.snapshot(now).pool("default")
    core.check_invariants()
    return [(g.labels, g.capacity, g.busy) for g in snap.groups], snap


def test_groups_are_kept_per_exact_label_set_and_pool_capacity_is_their_sum():
    core = labelled_core(unlabeled=2)
    set_group(core, 0, GPU, 2)
    set_group(core, 0, T4, 1)
    set_group(core, 0, GPU_EU, 3)
    set_group(core, 0, {"zone": "eu", "gpu": "a100"}, 4)      # the same set: replaces 3
    listed, snap = groups(core)
    assert listed == [({}, 2, 0), (GPU, 2, 0), (T4, 1, 0), (GPU_EU, 4, 0)]
    assert snap.capacity == 2 + 2 + 1 + 4
    core.set_capacity(0, "default", 5)                       # only the unlabeled group
    core.check_invariants()
    listed, snap = groups(core)
    assert listed == [({}, 5, 0), (GPU, 2, 0), (T4, 1, 0), (GPU_EU, 4, 0)]
    assert snap.capacity == 12
    set_group(core, 0, T4, 0)
    listed, snap = groups(core)
    assert (T4, 0, 0) in listed and snap.capacity == 11


def test_bad_group_arguments_raise_value_error():
    core = labelled_core()
    for labels, n in (({"gpu": "a100"}, -1), ({"gpu": ""}, 1), ({"": "x"}, 1)):
        with pytest.raises(ValueError):
            core.set_group_capacity(0, "default", labels, n)
    with raises_wrong_type("labels"):
        core.set_group_capacity(0, "default", [("gpu", "a")], 1)
    with pytest.raises(ValueError):
        core.set_group_capacity(0, "nope", GPU, 1)
    core.check_invariants()
    assert groups(core)[0] == [({}, 1, 0)]


def test_a_labelled_task_runs_only_in_a_group_whose_labels_include_its_own():
    core = labelled_core(unlabeled=2)
    set_group(core, 0, T4, 1)
    set_group(core, 0, GPU_EU, 1)
    a = submit(core, 0, "a100 job", labels=GPU)
    [d] = dispatches(drain(core))
    assert (d.task_id, d.group) == (a, GPU_EU)              # a superset of its labels
    b = submit(core, 0, "another a100 job", labels=GPU)
    eu = submit(core, 0, "eu job", labels={"zone": "eu"})
    assert dispatches(drain(core)) == []                    # free slots, none matching
    listed, snap = groups(core)
    assert listed == [({}, 2, 0), (T4, 1, 0), (GPU_EU, 1, 1)]
    assert snap.pending == 2 and snap.busy == 1
    assert core.status(b) == "ready" and core.status(eu) == "ready"


def test_a_waiting_labelled_task_does_not_block_the_pool():
    core = labelled_core(unlabeled=2)
    set_group(core, 0, GPU, 1)
    submit(core, 0, "gpu 1", labels=GPU)
    [g1] = dispatches(drain(core))
    waiting = submit(core, 0, "gpu 2", labels=GPU, priority="critical")
    p1 = submit(core, 0, "plain 1")
    p2 = submit(core, 0, "plain 2")
    ds = dispatches(drain(core))
    assert [(d.task_id, d.group) for d in ds] == [(p1, {}), (p2, {})]
    assert core.status(waiting) == "ready"
    out = finish(core, S, g1.lease)
    [d] = dispatches(out)
    assert (d.task_id, d.group) == (waiting, GPU)


def test_waiting_labelled_tasks_start_in_submission_order_when_a_matching_slot_frees():
    core = labelled_core(unlabeled=3)
    set_group(core, 0, GPU, 1)
    submit(core, 0, "first", labels=GPU)
    [d] = dispatches(drain(core))
    ids = [submit(core, 0, "normal", labels=GPU),
           submit(core, 0, "critical", labels=GPU, priority="critical"),
           submit(core, 0, "low", labels=GPU, priority="low")]
    assert dispatches(drain(core)) == []
    order = []
    t = 0
    for _ in range(3):
        t += S
        [d] = dispatches(finish(core, t, d.lease))
        assert d.group == GPU
        order.append(d.task_id)
    assert order == ids


def test_waiting_labelled_tasks_start_when_a_matching_group_gets_capacity():
    core = labelled_core(unlabeled=1)
    a = submit(core, 0, "arm a", labels={"arch": "arm"})
    b = submit(core, 0, "arm b", labels={"arch": "arm"})
    c = submit(core, 0, "arm c", labels={"arch": "arm"})
    p = submit(core, 0, "plain")
    assert [d.task_id for d in dispatches(drain(core))] == [p]
    out = set_group(core, S, {"arch": "x86"}, 2)            # not a match
    assert dispatches(out) == [] and core.status(a) == "ready"
    out = set_group(core, 2 * S, {"arch": "arm", "os": "linux"}, 2)
    ds = dispatches(out)
    assert [(d.task_id, d.group) for d in ds] == [(a, {"arch": "arm", "os": "linux"}),
                                                  (b, {"arch": "arm", "os": "linux"})]
    assert core.status(c) == "ready"
    assert core.cancel(3 * S, c)                            # a waiting task can be cancelled
    core.check_invariants()
    assert core.snapshot(3 * S).pool("default").pending == 0


def test_every_attempt_records_its_group():
    core = labelled_core(unlabeled=1)
    set_group(core, 0, GPU, 1)
    submit(core, 0, "plain 1")
    submit(core, 0, "plain 2")       # the unlabeled slot is taken: any free slot will do
    submit(core, 0, "plain 3")
    ds = dispatches(drain(core))
    assert [d.group for d in ds] == [{}, GPU]
    listed, snap = groups(core)
    assert listed == [({}, 1, 1), (GPU, 1, 1)]
    assert snap.pending == 1


def test_set_capacity_sets_the_unlabeled_group_only():
    core = labelled_core(unlabeled=2)
    set_group(core, 0, GPU, 1)
    core.set_capacity(0, "default", 0)
    core.check_invariants()
    a = submit(core, 0, "a")
    b = submit(core, 0, "b")
    [d] = dispatches(drain(core))
    assert (d.task_id, d.group) == (a, GPU)
    assert core.status(b) == "ready"
    core.set_capacity(S, "default", 1)
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert (d.task_id, d.group) == (b, {})


def test_shrinking_a_group_below_its_busy_slots_interrupts_nothing():
    core = labelled_core(unlabeled=0)
    set_group(core, 0, GPU, 2)
    submit(core, 0, "g1", labels=GPU)
    submit(core, 0, "g2", labels=GPU)
    g1, g2 = dispatches(drain(core))
    out = set_group(core, S, GPU, 1)
    assert aborts(out) == []
    listed, snap = groups(core, S)
    assert listed == [({}, 0, 0), (GPU, 1, 2)] and snap.busy == 2
    waiting = submit(core, S, "g3", labels=GPU)
    assert dispatches(finish(core, 2 * S, g1.lease)) == []  # 1 busy of 1: still full
    [d] = dispatches(finish(core, 3 * S, g2.lease))
    assert d.task_id == waiting


def test_a_labelled_fixed_start_runs_on_time_in_a_matching_group():
    core = labelled_core(unlabeled=2)
    set_group(core, 0, GPU, 1)
    task = submit(core, 0, "fixed", labels=GPU, start_at=10)
    submit(core, 0, "plain")
    drain(core)
    wake = core.next_wakeup()
    while wake is not None and wake <= 10 * S:
        core.advance(wake)
        core.check_invariants()
        for d in dispatches(drain(core)):
            assert (d.task_id, d.group, wake) == (task, GPU, 10 * S)
        wake = core.next_wakeup()
    assert core.status(task) == "running"
    assert core.snapshot(10 * S).pool("default").fixed_start_hit_rate == 1.0


def test_a_held_fixed_start_behind_an_unheld_label_waiter_still_starts():
    # Regression (issue 19, seeds 2296 and 6210 of the simulation): label
    # waiters were served head-first per label set, and a head without a held
    # slot was skipped while the pool had no free slot, so a held fixed start
    # queued behind it in the same label set never started: a free matching
    # slot, a ready task, and no dispatch ever again.
    core = labelled_core(unlabeled=1)
    plain = submit(core, 0, "plain gpu", labels=GPU)       # no gpu group yet: waits
    fixed = submit(core, 0, "fixed gpu", labels=GPU, start_at=10, tolerance=1.0)
    assert dispatches(drain(core)) == []
    run_to(core, 10 * S)                  # held at 9 s, due at 10 s, waits for a gpu slot
    assert core.status(fixed) == "ready" and core.snapshot(10 * S).pool("default").held == 1
    core.set_capacity(10 * S, "default", 0)
    core.check_invariants()
    [d] = dispatches(set_group(core, 10 * S, GPU, 1))
    assert d.task_id == fixed             # it starts on the slot held for it
    assert core.status(plain) == "ready"
    assert core.snapshot(10 * S).pool("default").fixed_start_hit_rate == 1.0
