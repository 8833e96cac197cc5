"""Recurring schedules: cron syntax and zones (with both DST transitions), how
occurrences are created, overlap policies, template rules and schedule changes."""

import datetime as dt

import pytest

from cronoq.core import (
    Core, CoreConfig, Dep, PoolConfig, ResourceConfig, ResourceExceedsCapacity, RetryPolicy,
    SchedulerError, TaskSpec, UnknownPool, UnknownResource,
)
from cronoq.core.metrics import bucket_mid, bucket_of
from cronoq.core.recurring import CronSchedule, rfc3339
from cronoq.simulation import Run, Simulator
from enginekit import S, dispatches, drain, run_to


def utc(text: str) -> int:
    """An RFC 3339 UTC time as Unix nanoseconds."""
    moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp()) * S


def new_core(at: str, max_workers=4, **config) -> Core:
    pool = PoolConfig("default", min=1, max=max_workers, initial=max_workers, autoscale=False)
    return Core(CoreConfig(**config), [pool], [ResourceConfig.semaphore("gpu", 2)], now=utc(at))


def occurrences(expr, tz, after, n):
    schedule = CronSchedule(expr, tz)
    t = utc(after)
    out = []
    for _ in range(n):
        t = schedule.next_after(t)
        out.append(rfc3339(t))
    return out


class Recorder:
    """A Simulator model that remembers every dispatch and runs it per ``plan``."""

    def __init__(self, sim_seconds=1.0, outcome="success"):
        self.seconds = sim_seconds
        self.outcome = outcome
        self.seen = []      # (time ns, Dispatch)
        self.sim = None

    def __call__(self, d):
        self.seen.append((self.sim.now, d))
        seconds = self.seconds(d) if callable(self.seconds) else self.seconds
        outcome = self.outcome(d) if callable(self.outcome) else self.outcome
        return Run(seconds, outcome)


def simulate(core, model):
    sim = Simulator(core, model, check=True)
    model.sim = sim
    return sim


# ------------------------------------------------------------------ cron syntax

@pytest.mark.parametrize("expr, after, expected", [
    ("30 2 * * *", "2026-01-01T00:00:00Z", ["2026-01-01T02:30:00Z", "2026-01-02T02:30:00Z"]),
    # Six fields: seconds first.
    ("15 30 2 * * *", "2026-01-01T00:00:00Z", ["2026-01-01T02:30:15Z", "2026-01-02T02:30:15Z"]),
    ("30 * * * * *", "2026-01-01T00:00:00Z", ["2026-01-01T00:00:30Z", "2026-01-01T00:01:30Z"]),
    ("*/20 * * * * *", "2026-01-01T00:00:00Z", ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z"]),
    # Names of months and weekdays.
    ("0 9 * JAN MON", "2026-01-01T00:00:00Z", ["2026-01-05T09:00:00Z", "2026-01-12T09:00:00Z"]),
    ("0 9 1 FEB,MAR *", "2026-01-01T00:00:00Z", ["2026-02-01T09:00:00Z", "2026-03-01T09:00:00Z"]),
    ("0 18 * * FRI", "2026-01-01T00:00:00Z", ["2026-01-02T18:00:00Z", "2026-01-09T18:00:00Z"]),
    # Nicknames.
    ("@hourly", "2026-01-01T00:00:30Z", ["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"]),
    ("@daily", "2026-01-01T00:00:00Z", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
    ("@weekly", "2026-01-01T00:00:00Z", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
])
def test_five_and_six_fields_names_and_nicknames(expr, after, expected):
    assert occurrences(expr, "UTC", after, 2) == expected


def test_next_after_is_strictly_after():
    schedule = CronSchedule("0 * * * *")
    assert schedule.next_after(utc("2026-01-01T01:00:00Z")) == utc("2026-01-01T02:00:00Z")
    assert schedule.next_after(utc("2026-01-01T01:00:00Z") - 1) == utc("2026-01-01T01:00:00Z")


@pytest.mark.parametrize("expr", ["61 * * * *", "* * * *", "* * * * * * *", "@often", "", "   ",
                                  "@hourly 5", "a b c d e"])
def test_bad_expressions_raise_value_error(expr):
    with pytest.raises(ValueError):
        CronSchedule(expr)


def test_zones_default_to_utc_and_follow_the_zone_offset():
    assert CronSchedule("0 9 * * *").tz == "UTC"
    assert occurrences("0 9 * * *", "UTC", "2026-07-01T00:00:00Z", 1) == ["2026-07-01T09:00:00Z"]
    # Lisbon is UTC+1 in summer, UTC+0 in winter; New York UTC-4 / UTC-5.
    assert occurrences("0 9 * * *", "Europe/Lisbon", "2026-07-01T00:00:00Z", 1) == ["2026-07-01T08:00:00Z"]
    assert occurrences("0 9 * * *", "Europe/Lisbon", "2026-01-10T00:00:00Z", 1) == ["2026-01-10T09:00:00Z"]
    assert occurrences("0 9 * * *", "America/New_York", "2026-07-01T00:00:00Z", 1) == ["2026-07-01T13:00:00Z"]
    assert occurrences("0 9 * * *", "America/New_York", "2026-01-10T00:00:00Z", 1) == ["2026-01-10T14:00:00Z"]
    with pytest.raises(ValueError):
        CronSchedule("0 9 * * *", "Mars/Olympus_Mons")


# ------------------------------------------------------------------ daylight saving

def test_spring_forward_gap_runs_at_the_first_instant_after_the_gap():
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:30 does not exist.
    assert occurrences("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 3) == [
        "2026-03-08T07:00:00Z",     # 03:00 EDT, the first instant after the gap
        "2026-03-09T06:30:00Z",     # 02:30 EDT
        "2026-03-10T06:30:00Z"]
    # Lisbon, 2026-03-29: 01:00 WET jumps to 02:00 WEST (01:00 UTC).
    assert occurrences("30 1 * * *", "Europe/Lisbon", "2026-03-28T12:00:00Z", 2) == [
        "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    # Several skipped wall times collapse into one run at the end of the gap.
    assert occurrences("*/15 * * * *", "America/New_York", "2026-03-08T06:30:00Z", 4) == [
        "2026-03-08T06:45:00Z",     # 01:45 EST
        "2026-03-08T07:00:00Z",     # 02:00, 02:15, 02:30, 02:45 and 03:00 EDT: once
        "2026-03-08T07:15:00Z",
        "2026-03-08T07:30:00Z"]


def test_fall_back_repeated_hour_runs_once_at_its_first_instance():
    # New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens at
    # 05:30 UTC (EDT) and again at 06:30 UTC (EST). Only the first runs.
    assert occurrences("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 3) == [
        "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]
    assert occurrences("*/30 * * * *", "America/New_York", "2026-11-01T04:45:00Z", 5) == [
        "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z",      # 01:00, 01:30 EDT
        "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z",      # 02:00, 02:30 EST
        "2026-11-01T08:00:00Z"]
    # Asking from inside the repeated hour does not yield the second instance.
    schedule = CronSchedule("30 1 * * *", "America/New_York")
    assert schedule.next_after(utc("2026-11-01T06:00:00Z")) == utc("2026-11-02T06:30:00Z")
    # Lisbon, 2026-10-25: 02:00 WEST falls back to 01:00 WET.
    assert occurrences("30 1 * * *", "Europe/Lisbon", "2026-10-24T12:00:00Z", 2) == [
        "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]


def run_schedule(at, until, name, cron, template, tz="UTC", seconds=1.0, **options):
    core = new_core(at)
    core.add_recurring(core.now, name, cron, template, tz=tz, **options)
    core.check_invariants()
    model = Recorder(seconds)
    sim = simulate(core, model)
    sim.advance_to(utc(until))
    core.check_invariants()
    return core, sim, model


def test_engine_runs_a_lisbon_schedule_across_spring_forward():
    core, _, model = run_schedule("2026-03-28T12:00:00Z", "2026-03-31T12:00:00Z", "nightly",
                                    "30 1 * * *", TaskSpec("export", key="nightly"),
                                    tz="Europe/Lisbon")
    assert [(rfc3339(t), d.key) for t, d in model.seen] == [
        ("2026-03-29T01:00:00Z", "nightly@2026-03-29T01:00:00Z"),
        ("2026-03-30T00:30:00Z", "nightly@2026-03-30T00:30:00Z"),
        ("2026-03-31T00:30:00Z", "nightly@2026-03-31T00:30:00Z")]
    assert core.snapshot(core.now).pool("default").fixed_start_hit_rate == 1.0


def test_engine_runs_a_new_york_schedule_once_across_fall_back():
    core, _, model = run_schedule("2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z", "half-past",
                                    "30 1 * * *", TaskSpec("job", key="hp"), tz="America/New_York")
    assert [rfc3339(t) for t, _ in model.seen] == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert [d.key for _, d in model.seen] == ["hp@2026-11-01T05:30:00Z", "hp@2026-11-02T06:30:00Z"]
    assert core.snapshot(core.now).totals["succeeded"] == 2


def test_engine_every_half_hour_across_fall_back_skips_the_repeated_hour():
    _, _, model = run_schedule("2026-11-01T04:50:00Z", "2026-11-01T07:40:00Z", "half",
                                    "*/30 * * * *", TaskSpec("job"), tz="America/New_York")
    assert [rfc3339(t) for t, _ in model.seen] == [
        "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"]


# ------------------------------------------------------------------ occurrences

def test_an_occurrence_is_created_hold_lead_plus_tolerance_ahead_as_a_tagged_fixed_start():
    core = new_core("2026-01-01T00:00:30Z")
    core.add_recurring(core.now, "hourly", "@hourly", TaskSpec("tick", key="hourly", tags={"team": "a"}))
    core.check_invariants()
    start = utc("2026-01-01T01:00:00Z")
    # No history: hold lead = tolerance = 1 s, so the occurrence appears 2 s ahead.
    assert core.next_wakeup() == start - 2 * S
    run_to(core, start - 2 * S - 1)
    assert core.snapshot(core.now).live_tasks == 0
    run_to(core, start - 2 * S)
    snap = core.snapshot(core.now)
    assert snap.live_tasks == 1 and snap.pool("default").reservations == 1
    assert core.status("hourly@2026-01-01T01:00:00Z") == "scheduled"
    out = run_to(core, start)
    [d] = [a for _, a in out if type(a).__name__ == "Dispatch"]
    assert d.key == "hourly@2026-01-01T01:00:00Z"
    assert d.tags == {"team": "a", "cronoq.recurring": "hourly"}
    assert d.payload == "tick"
    # Only one occurrence ahead: the next is created 2 s before 02:00, not now.
    assert core.snapshot(core.now).live_tasks == 1
    assert core.next_wakeup() == utc("2026-01-01T02:00:00Z") - 2 * S
    assert core.complete(start + 10 * S, d.lease)
    core.check_invariants()
    # The occurrence's own run time is a fixed start's: it does not move the lead.
    assert core.next_wakeup() == utc("2026-01-01T02:00:00Z") - 2 * S
    assert core.snapshot(core.now).pool("default").fixed_start_hit_rate == 1.0


def test_the_creation_lead_follows_the_pools_regular_work_and_the_schedule_tolerance():
    core = new_core("2026-01-01T00:00:00Z")
    now = core.now
    for _ in range(5):                   # regular work of 30 s: hold lead about 30 s
        core.submit(now, TaskSpec("regular"))
        [d] = dispatches(drain(core))
        now += 30 * S
        core.complete(now, d.lease)
        core.check_invariants()
    lead = int(bucket_mid(bucket_of(30 * S)))     # the p90 of the pool's regular work
    assert 28 * S < lead < 33 * S
    core.add_recurring(now, "r", "0 * * * *", TaskSpec("job"), tolerance=10)
    assert core.next_wakeup() == utc("2026-01-01T01:00:00Z") - lead - 10 * S


def test_the_creation_lead_is_capped_by_max_hold():
    core = new_core("2026-01-01T00:00:00Z", max_hold=60.0)
    core.add_recurring(core.now, "r", "0 * * * *", TaskSpec("job"), tolerance=45)
    assert core.next_wakeup() == utc("2026-01-01T01:00:00Z") - 60 * S    # not 45 + 45


def test_only_one_occurrence_exists_ahead_and_the_next_is_created_when_it_is_due():
    core = new_core("2026-01-01T00:00:00Z", emit_transitions=True)
    core.add_recurring(core.now, "fast", "*/2 * * * * *", TaskSpec("job"))   # every 2 s, lead 2 s
    model = Recorder(0.5)
    sim = simulate(core, model)
    ahead = []
    t0 = utc("2026-01-01T00:00:00Z")
    for k in range(1, 41):
        sim.advance_to(t0 + k * S // 4)
        ahead.append(sum(1 for e in core.tasks.values() if e.status == "scheduled"))
    assert max(ahead) == 1
    created = [round(e.at - t0 / S, 3) for e in sim.events if e.status == "scheduled"]
    starts = [(t - t0) / S for t, _ in model.seen]
    assert starts == [2.0, 4.0, 6.0, 8.0, 10.0]
    # The first one 2 s ahead (hold lead 1 s + tolerance 1 s), each next one only
    # when the one before is due.
    assert created == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_template_fields_are_copied_and_deadline_in_is_relative_to_each_start():
    core = new_core("2026-01-01T00:00:00Z")
    template = TaskSpec({"n": 1}, kind="report", priority="high", deadline_in=3600, timeout=30,
                        tags={"x": "y"}, tenant="acme", resources={"gpu": 1}, key="rep")
    core.add_recurring(core.now, "rep", "0 * * * *", template)
    model = Recorder(1.0)
    sim = simulate(core, model)
    sim.advance_to(utc("2026-01-01T01:00:00Z") + S // 2)
    [(_, first)] = model.seen
    entry = core.tasks[first.task_id]            # running: the options it carries
    assert entry.cls == 1 and entry.spec.tenant == "acme" and entry.spec.resources == {"gpu": 1}
    assert core.resources["gpu"].available == 1
    sim.advance_to(utc("2026-01-01T02:00:01Z"))
    assert len(model.seen) == 2
    for (t, d), hour in zip(model.seen, (1, 2)):
        start = utc(f"2026-01-01T0{hour}:00:00Z")
        assert t == start
        assert d.deadline == start / S + 3600
        assert (d.kind, d.timeout, d.payload) == ("report", 30.0, {"n": 1})
        assert d.tags == {"x": "y", "cronoq.recurring": "rep"}
        assert d.key == f"rep@2026-01-01T0{hour}:00:00Z"
    # The template itself is left as it was.
    assert template.deadline_in_ns == 3600 * S and template.start_at_ns is None
    assert template.tags == {"x": "y"}


def test_without_a_key_occurrences_have_no_key():
    _, _, model = run_schedule("2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z", "k",
                                    "* * * * *", TaskSpec("job"))
    assert [d.key for _, d in model.seen] == [None, None, None]


# ------------------------------------------------------------------ overlap

def test_overlap_skip_skips_an_occurrence_while_the_previous_still_runs():
    # Every 10 s; every run takes 25 s. 10 s runs until 35 s: 20 s and 30 s are
    # skipped (the 10 s run is still going), 40 s runs, and so on.
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "s", "*/10 * * * * *", TaskSpec("job"), overlap="skip")
    model = Recorder(25.0)
    sim = simulate(core, model)
    sim.advance_to(t0 + 75 * S)
    assert [(t - t0) // S for t, _ in model.seen] == [10, 40, 70]
    skipped = [e for e in sim.events if e.status == "skipped"]
    assert [round(e.at - t0 / S) for e in skipped] == [20, 30, 50, 60]
    assert all("still running" in e.message for e in skipped)
    assert core.snapshot(core.now).totals["skipped"] == 4


def test_overlap_skip_runs_the_next_occurrence_when_the_previous_ended_in_time():
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "s", "*/10 * * * * *", TaskSpec("job"))      # skip is the default
    model = Recorder(9.0)
    sim = simulate(core, model)
    sim.advance_to(t0 + 45 * S)
    assert [(t - t0) // S for t, _ in model.seen] == [10, 20, 30, 40]
    assert core.snapshot(core.now).totals["skipped"] == 0


def test_overlap_allow_runs_occurrences_side_by_side():
    core = new_core("2026-01-01T00:00:00Z", max_workers=10)
    t0 = core.now
    core.add_recurring(t0, "a", "*/10 * * * * *", TaskSpec("job"), overlap="allow")
    model = Recorder(25.0)
    sim = simulate(core, model)
    sim.advance_to(t0 + 44 * S)
    assert [(t - t0) // S for t, _ in model.seen] == [10, 20, 30, 40]
    assert core.snapshot(core.now).pool("default").busy == 3        # 20, 30 and 40 s runs
    assert core.snapshot(core.now).totals["skipped"] == 0


def test_overlap_queue_waits_for_the_previous_and_runs_after_it_even_if_it_failed():
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "q", "*/10 * * * * *", TaskSpec("job", retry=RetryPolicy.none()),
                       overlap="queue")
    model = Recorder(15.0, outcome=lambda d: "permanent")
    sim = simulate(core, model)
    sim.advance_to(t0 + 22 * S)
    [second] = [e for e in core.tasks.values() if e.status == "blocked"]
    sim.advance_to(t0 + 61 * S)
    # 10 -> 25, then 20 (queued) runs 25 -> 40, 30 runs 40 -> 55, 40 runs at 55.
    assert [(t - t0) // S for t, _ in model.seen] == [10, 25, 40, 55]
    assert second.id == model.seen[1][1].task_id
    totals = core.snapshot(core.now).totals
    assert totals["failed"] == 3 and totals["skipped"] == 0


def test_overlap_queue_on_success_skips_after_a_failure():
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "q", "*/10 * * * * *", TaskSpec("job", retry=RetryPolicy.none()),
                       overlap="queue_on_success")
    outcomes = iter(["permanent", "success", "success"])
    model = Recorder(15.0, outcome=lambda d: next(outcomes))
    sim = simulate(core, model)
    sim.advance_to(t0 + 26 * S)
    # The 10 s run failed at 25 s: the 20 s occurrence waiting on it is skipped.
    assert [(t - t0) // S for t, _ in model.seen] == [10]
    skipped = [e for e in sim.events if e.status == "skipped"]
    assert len(skipped) == 1 and skipped[0].at == (t0 + 25 * S) / S
    sim.advance_to(t0 + 45 * S)
    # The chain resumes: 30 s runs (its predecessor was skipped, not failed), and
    # 40 s waits for it, then runs at 45 s.
    assert [(t - t0) // S for t, _ in model.seen] == [10, 30, 45]
    assert core.snapshot(core.now).totals["skipped"] == 1


def test_queued_occurrence_waiting_past_its_tolerance_follows_the_miss_policy():
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "q", "*/10 * * * * *", TaskSpec("job"), overlap="queue", on_miss="skip",
                       tolerance=2)
    model = Recorder(15.0)
    sim = simulate(core, model)
    sim.advance_to(t0 + 30 * S)
    missed = [e for e in sim.events if e.status == "missed"]
    assert [round(e.at - t0 / S) for e in missed] == [22]
    assert [(t - t0) // S for t, _ in model.seen][:1] == [10]


# ------------------------------------------------------------------ template rules

@pytest.mark.parametrize("options", [
    dict(deadline_at=2_000_000_000), dict(start_in=5), dict(start_at=2_000_000_000),
    dict(after="x"), dict(deps=[Dep("x", on="complete")]),
])
def test_templates_describing_a_single_task_are_rejected(options):
    core = new_core("2026-01-01T00:00:00Z")
    with pytest.raises(SchedulerError):
        core.add_recurring(core.now, "bad", "@hourly", TaskSpec("job", **options))
    core.check_invariants()
    assert core.recurring == {} and core.next_wakeup() is None


@pytest.mark.parametrize("options, error", [
    (dict(pool="nope"), UnknownPool),
    (dict(resources={"fpga": 1}), UnknownResource),
    (dict(resources={"gpu": 3}), ResourceExceedsCapacity),
])
def test_templates_are_checked_like_a_submission(options, error):
    core = new_core("2026-01-01T00:00:00Z")
    with pytest.raises(error):
        core.add_recurring(core.now, "bad", "@hourly", TaskSpec("job", **options))
    core.check_invariants()
    assert core.recurring == {} and core.next_wakeup() is None


@pytest.mark.parametrize("options", [dict(overlap="sometimes"), dict(tz="Nowhere/Land"),
                                     dict(on_miss="panic"), dict(tolerance=-1)])
def test_bad_schedule_options_raise_value_error(options):
    core = new_core("2026-01-01T00:00:00Z")
    with pytest.raises(ValueError):
        core.add_recurring(core.now, "bad", "@hourly", TaskSpec("job"), **options)
    with pytest.raises(ValueError):
        core.add_recurring(core.now, "bad", "not a cron", TaskSpec("job"))
    assert core.recurring == {} and core.next_wakeup() is None


# ------------------------------------------------------------------ conflicts, replace, remove

def test_an_occurrence_that_cannot_be_reserved_is_counted_and_the_next_one_runs():
    core = new_core("2026-01-01T00:00:00Z", max_workers=2)       # one reservation at a time
    t0 = core.now
    blocker = core.submit(t0, TaskSpec("one-off", start_at=(t0 + 60 * S) / S, duration_hint=30))[0]
    core.add_recurring(t0, "m", "* * * * *", TaskSpec("job", duration_hint=5))
    model = Recorder(1.0)
    sim = simulate(core, model)
    sim.advance_to(t0 + 121 * S)
    assert core.snapshot(core.now).totals["recurring_conflicts"] == 1
    assert [((t - t0) // S, d.task_id == blocker) for t, d in model.seen] == [(60, True), (120, False)]


def test_replacing_a_schedule_does_not_duplicate_the_created_occurrence():
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "r", "0 * * * *", TaskSpec("old", key="r"))
    run_to(core, utc("2026-01-01T00:59:58Z"))
    assert core.snapshot(core.now).live_tasks == 1
    core.add_recurring(core.now, "r", "0 * * * *", TaskSpec("new", key="r"))
    core.check_invariants()
    assert core.snapshot(core.now).live_tasks == 1
    model = Recorder(1.0)
    sim = simulate(core, model)
    sim.advance_to(utc("2026-01-01T02:00:02Z"))
    assert [(rfc3339(t), d.payload, d.key) for t, d in model.seen] == [
        ("2026-01-01T01:00:00Z", "old", "r@2026-01-01T01:00:00Z"),
        ("2026-01-01T02:00:00Z", "new", "r@2026-01-01T02:00:00Z")]


def test_replacing_with_another_cron_takes_effect_after_the_created_occurrence():
    core = new_core("2026-01-01T00:00:00Z")
    core.add_recurring(core.now, "r", "0 * * * *", TaskSpec("hourly"))
    run_to(core, utc("2026-01-01T00:59:59Z"))
    core.add_recurring(core.now, "r", "*/20 * * * *", TaskSpec("third"))
    model = Recorder(1.0)
    sim = simulate(core, model)
    sim.advance_to(utc("2026-01-01T01:40:02Z"))
    assert [(rfc3339(t), d.payload) for t, d in model.seen] == [
        ("2026-01-01T01:00:00Z", "hourly"), ("2026-01-01T01:20:00Z", "third"),
        ("2026-01-01T01:40:00Z", "third")]


def test_removing_a_schedule_stops_future_occurrences_but_leaves_the_created_one():
    core = new_core("2026-01-01T00:00:00Z")
    core.add_recurring(core.now, "r", "0 * * * *", TaskSpec("job"))
    run_to(core, utc("2026-01-01T00:59:58Z"))
    assert core.remove_recurring(core.now, "r") is True
    assert core.remove_recurring(core.now, "r") is False
    core.check_invariants()
    model = Recorder(1.0)
    sim = simulate(core, model)
    sim.advance_to(utc("2026-01-01T05:00:00Z"))
    assert [rfc3339(t) for t, _ in model.seen] == ["2026-01-01T01:00:00Z"]
    assert core.next_wakeup() is None


def test_schedule_tolerance_and_miss_policy_apply_to_occurrences():
    core = new_core("2026-01-01T00:00:00Z", max_workers=1)
    t0 = core.now
    core.submit(t0, TaskSpec("long"))
    [long] = dispatches(drain(core))
    core.add_recurring(t0, "r", "* * * * *", TaskSpec("job", tolerance=100), tolerance=5,
                       on_miss="fail")
    out = run_to(core, t0 + 65 * S)
    failed = [a for _, a in out if type(a).__name__ == "StatusEvent" and a.status == "failed"]
    assert [(e.at - t0 / S) for e in failed] == [65.0]
    assert core.snapshot(core.now).pool("default").fixed_start_hit_rate == 0.0
    assert core.complete(t0 + 66 * S, long.lease)
    core.check_invariants()


@pytest.mark.parametrize("on_miss, runs, missed", [("run_late", 1, 0), ("skip", 0, 1), ("fail", 0, 1)])
def test_after_a_gap_in_driver_calls_at_most_one_late_occurrence_then_it_resumes(on_miss, runs, missed):
    core = new_core("2026-01-01T00:00:00Z")
    t0 = core.now
    core.add_recurring(t0, "m", "* * * * *", TaskSpec("job", key="m"), on_miss=on_miss)
    core.advance(t0 + 600 * S)                 # ten minutes without a call
    core.check_invariants()
    out = drain(core)
    late = dispatches(out)
    assert [d.key for d in late] == ["m@2026-01-01T00:01:00Z"] * runs
    assert core.snapshot(core.now).totals["missed"] == missed
    for d in late:
        assert core.complete(core.now + S, d.lease)
        core.check_invariants()
    # Missed occurrences are not replayed one by one: the next one is 00:11.
    assert core.next_wakeup() == utc("2026-01-01T00:10:58Z")
    out = run_to(core, utc("2026-01-01T00:11:00Z"))
    assert [(t, a.key) for t, a in out if type(a).__name__ == "Dispatch"] == [
        (utc("2026-01-01T00:11:00Z"), "m@2026-01-01T00:11:00Z")]


def test_an_occurrence_says_how_many_attempts_it_has_like_a_submitted_task():
    from cronoq.core import RetryPolicy

    core = new_core("2026-01-01T00:00:30Z", emit_transitions=True)
    core.add_recurring(core.now, "hourly", "@hourly", TaskSpec("tick", key="hourly"))
    core.add_recurring(core.now, "twice", "@hourly", TaskSpec("tock", key="twice",
                                                                retry=RetryPolicy(max_attempts=2)))
    out = run_to(core, utc("2026-01-01T01:00:00Z"))
    # The pool's policy (3 attempts) or the template's own: in the task's record and in its events.
    assert core.info("hourly@2026-01-01T01:00:00Z").max_attempts == 3
    assert core.info("twice@2026-01-01T01:00:00Z").max_attempts == 2
    events = [a for _, a in out if type(a).__name__ == "StatusEvent"]
    assert events and {(e.key, e.max_attempts) for e in events} == {
        ("hourly@2026-01-01T01:00:00Z", 3), ("twice@2026-01-01T01:00:00Z", 2)}
    # And once it ended, in the record the engine retains.
    for d in [a for _, a in out if type(a).__name__ == "Dispatch"]:
        assert core.complete(core.now, d.lease)
    core.check_invariants()
    ended = core.info("twice@2026-01-01T01:00:00Z")
    assert ended.status == "succeeded" and ended.max_attempts == 2
