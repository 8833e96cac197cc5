"""Replays of crafted traces: each policy knob moves the outcome the way it
should, and the replay honours what the trace says (cancellations,
batches, dependencies, durations)."""

import json
import statistics

import pytest

from cronoq.core import NS
from cronoq.whatif import Report, ReplayError, Trace, parse_policy_file, replay
from cronoq.whatif.replay import REFUSED

T0 = 1_800_000_000.0


def trace_of(tasks, pools, resources=None, **policy):
    header = {"cronoq_trace": 1, "t0": T0,
              "policy": {"pools": pools, "resources": resources or {}, **policy}}
    return Trace.loads("\n".join(json.dumps(x) for x in [header, *tasks]))


def compare(trace, toml, **options):
    """The report of every variant of ``toml`` (its figures by variant name) and the results."""
    variants = parse_policy_file(toml).variants_for(trace.policy)
    results = [replay(trace, v, **options) for v in variants]
    report = Report(trace, results)
    return {f.name: f for f in report.variants}, {r.variant.name: r for r in results}


def fixed_pool(workers, **more):
    return {"min": workers, "max": max(workers, 1), "initial": workers, "autoscale": False, **more}


def stream(n, every, seconds, start=0.0, **options):
    return [{"task": f"{options.get('kind', 't')}{i}-{start}", "at": start + i * every, "seconds": seconds,
             **options} for i in range(n)]


def waits_of(trace, result, keep):
    return [(result.first_start[i] - trace.t0_ns - t.at_ns) / NS
            for i, t in enumerate(trace.tasks) if keep(t) and result.first_start[i] >= 0]


# ---------------------------------------------------------------- the knobs


def test_more_fixed_capacity_shortens_waits_and_the_run():
    trace = trace_of(stream(60, 0.1, 1.0, kind="job"), {"app": fixed_pool(2)})
    figs, _ = compare(trace, '''
[[variant]]
name = "two"
[[variant]]
name = "six"
pools.app.initial = 6
pools.app.max = 6
pools.app.min = 6
''')
    two, six = figs["two"], figs["six"]
    assert six.waits["all"].p50 < two.waits["all"].p50 and six.waits["all"].p99 < two.waits["all"].p99
    assert six.makespan < two.makespan
    assert two.utilization > six.utilization


def test_a_higher_autoscaling_max_shortens_waits_and_a_higher_min_costs_more():
    burst = stream(300, 0.0, 0.5, kind="job")
    pools = {"app": {"min": 1, "max": 4, "autoscale": {"cost_per_worker_second": 0.01}}}
    figs, _ = compare(trace_of(burst, pools), '''
[[variant]]
name = "max 4"
[[variant]]
name = "max 32"
pools.app.max = 32
[[variant]]
name = "min 4"
pools.app.min = 4
''')
    assert figs["max 32"].waits["all"].p90 < figs["max 4"].waits["all"].p90
    assert figs["max 32"].makespan < figs["max 4"].makespan
    quiet = stream(20, 1.0, 0.1, kind="tick")   # little work: the floor decides the cost
    figs, _ = compare(trace_of(quiet, pools), '''
[[variant]]
name = "min 1"
[[variant]]
name = "min 4"
pools.app.min = 4
pools.app.initial = 4
''')
    assert figs["min 4"].worker_seconds > 3 * figs["min 1"].worker_seconds
    assert figs["min 4"].cost > 3 * figs["min 1"].cost


def test_autoscaling_settings_move_capacity_waits_and_cost():
    steady = stream(400, 0.05, 0.4, kind="job", priority="high")
    pools = {"app": {"min": 1, "max": 40, "autoscale": {"cost_per_worker_second": 0.001}}}
    figs, results = compare(trace_of(steady, pools), '''
[[variant]]
name = "default"
[[variant]]
name = "eager"
pools.app.autoscale.target_utilization = 0.3
pools.app.autoscale.slo = { high = 0.05 }
[[variant]]
name = "pricier"
pools.app.autoscale.cost_per_worker_second = 0.002
[[variant]]
name = "off"
pools.app.autoscale = false
''')
    default, eager = figs["default"], figs["eager"]
    assert eager.waits["high"].p90 < default.waits["high"].p90
    assert eager.worker_seconds > default.worker_seconds and eager.utilization < default.utilization
    assert figs["pricier"].cost == pytest.approx(2 * default.cost)    # same schedule, twice the price
    assert figs["pricier"].worker_seconds == default.worker_seconds
    assert figs["off"].waits["high"].p90 > 10 * default.waits["high"].p90   # one worker, never more
    peaks = {name: max(row["app"][0] for _, row in r.samples) for name, r in results.items()}
    assert peaks["off"] == 1 and peaks["eager"] > peaks["default"] > 1


def starving(high_every=0.09):
    """One worker; 20 low tasks at once, and a minute of high tasks that keep it busy."""
    return trace_of(stream(20, 0.0, 0.1, kind="bg", priority="low")
                    + stream(int(60 / high_every), high_every, 0.1, start=0.01, kind="fg", priority="high"),
                    {"app": fixed_pool(1)})


def test_aging_lets_waiting_low_tasks_through_sooner():
    figs, _ = compare(starving(), '''
[[variant]]
name = "no aging"
priority.aging_rate = [0, 0, 0, 0]
[[variant]]
name = "strong aging"
priority.aging_rate = [0, 0, 0, 200]
priority.age_cap = [0, 0, 0, 5000]
''')
    none, strong = figs["no aging"], figs["strong aging"]
    assert strong.waits["low"].p50 < none.waits["low"].p50 / 2
    assert strong.waits["high"].p99 > none.waits["high"].p99
    assert strong.priority_adherence < none.priority_adherence


def test_class_weights_decide_which_class_goes_first():
    figs, _ = compare(starving(), '''
[[variant]]
name = "usual"
[[variant]]
name = "low first"
priority.base = { low = 20000 }
''')
    usual, low_first = figs["usual"], figs["low first"]
    assert low_first.waits["low"].max < 3.0 < usual.waits["low"].p50
    assert low_first.waits["high"].max > usual.waits["high"].max


def test_tenant_weights_share_a_pool_by_weight():
    tasks = [{"task": f"{tenant}{i}", "at": 0.0, "seconds": 0.1, "tenant": tenant}
             for i in range(100) for tenant in ("a", "b")]
    trace = trace_of(tasks, {"app": fixed_pool(1, tenant_weights={"a": 1, "b": 1})})
    _, results = compare(trace, '''
[[variant]]
name = "equal"
[[variant]]
name = "a counts thrice"
pools.app.tenant_weights = { a = 3, b = 1 }
''')

    def mean_wait(result, tenant):
        return statistics.mean(waits_of(trace, result, lambda t: t.spec.tenant == tenant))

    equal, weighted = results["equal"], results["a counts thrice"]
    assert mean_wait(equal, "a") == pytest.approx(mean_wait(equal, "b"), rel=0.05)
    assert mean_wait(weighted, "a") < 0.75 * mean_wait(equal, "a")
    assert mean_wait(weighted, "b") > mean_wait(equal, "b")


def test_looser_resource_limits_shorten_the_waits_they_cause():
    chats = [{"task": i, "at": 0.0, "seconds": 0.2, "kind": "chat", "resources": {"api": 1, "db": 1}}
             for i in range(40)]
    trace = trace_of(chats, {"app": fixed_pool(40)},
                     {"api": {"kind": "token_bucket", "rate": 2.0, "burst": 2}, "db": {"permits": 8}})
    figs, _ = compare(trace, '''
[[variant]]
name = "2 per s"
[[variant]]
name = "10 per s"
resources.api.rate = 10
resources.api.burst = 10
[[variant]]
name = "2 per s, 1 db"
resources.db.permits = 1
''')
    assert figs["10 per s"].waits["all"].p90 < figs["2 per s"].waits["all"].p90 / 3
    assert figs["2 per s, 1 db"].waits["all"].p90 > figs["2 per s"].waits["all"].p90


def test_overflow_policies_decide_what_a_full_queue_does():
    tasks = stream(10, 0.0, 1.0, kind="bg", priority="low") + stream(10, 0.0, 1.0, start=0.001, kind="job",
                                                                       priority="high")
    trace = trace_of(tasks, {"app": fixed_pool(1, max_pending=5, overflow="reject")})
    figs, results = compare(trace, '''
[[variant]]
name = "reject"
[[variant]]
name = "wait"
pools.app.overflow = "wait"
[[variant]]
name = "shed lowest"
pools.app.overflow = "shed_lowest"
[[variant]]
name = "unbounded"
pools.app.max_pending = false
''')
    assert figs["reject"].endings[REFUSED] == 14 and figs["reject"].endings["succeeded"] == 6
    assert figs["wait"].endings[REFUSED] == 0 and figs["wait"].endings["succeeded"] == 20
    assert figs["wait"].waits["all"].max > figs["unbounded"].waits["all"].p50
    shed = results["shed lowest"]
    assert figs["shed lowest"].endings["shed"] > 0
    assert all(trace.tasks[i].spec.kind == "bg" for i, s in enumerate(shed.status) if s == "shed")
    assert figs["unbounded"].endings["succeeded"] == 20 and figs["unbounded"].endings["shed"] == 0


def test_the_retry_policy_decides_what_a_flaky_task_becomes():
    flaky = [{"task": i, "at": i * 0.5, "kind": "flaky",
              "attempts": [{"seconds": 0.1, "outcome": "retryable"}, {"seconds": 0.1, "outcome": "retryable"},
                           {"seconds": 0.1, "outcome": "success"}]} for i in range(10)]
    pools = {"app": fixed_pool(4, retry={"max_attempts": 2, "initial_backoff": 0.1, "jitter": False})}
    figs, _ = compare(trace_of(flaky, pools), '''
[[variant]]
name = "two attempts"
[[variant]]
name = "three attempts"
pools.app.retry.max_attempts = 3
[[variant]]
name = "slow backoff"
pools.app.retry = { max_attempts = 3, initial_backoff = 5.0, jitter = false }
''')
    assert figs["two attempts"].endings["dead_lettered"] == 10 and figs["two attempts"].retries == 10
    assert figs["three attempts"].endings["succeeded"] == 10 and figs["three attempts"].retries == 20
    assert figs["slow backoff"].makespan > figs["three attempts"].makespan + 10


# ---------------------------------------------------------------- what the trace says


def test_cancellations_batches_dependencies_and_duplicates_are_replayed():
    tasks = [
        {"task": 1, "at": 0.0, "key": "extract", "seconds": 1.0, "batch": 1},
        {"task": 2, "at": 0.0, "key": "load", "after": "extract", "seconds": 1.0, "batch": 1},
        {"task": 3, "at": 0.1, "deps": [[2, "failure"]], "seconds": 1.0},              # by id: remapped
        {"task": 4, "at": 0.5, "kind": "long", "seconds": 30.0},
        {"task": 5, "at": 0.6, "key": "extract", "seconds": 1.0},                      # a duplicate
    ]
    trace = Trace.loads("\n".join(json.dumps(x) for x in [
        {"cronoq_trace": 1, "t0": T0, "policy": {"pools": {"app": fixed_pool(2)}}}, *tasks,
        {"cancel": 4, "at": 5.0}]))
    figs, results = compare(trace, "")
    r = results["recorded"]
    assert r.status == ["succeeded", "succeeded", "skipped", "cancelled", "duplicate"]
    assert r.first_start[1] - r.first_start[0] == NS          # after its parent
    assert r.end[3] - trace.t0_ns == 5 * NS                    # cancelled at the recorded time


def test_attempts_beyond_the_trace_and_untimed_ones_use_the_fallbacks():
    tasks = [{"task": 1, "at": 0.0, "kind": "report"},                    # never ran live: no time
             {"task": 2, "at": 0.0, "kind": "render", "duration_hint": 3.0},
             {"task": 3, "at": 0.0, "kind": "other"},
             {"task": 4, "at": 0.0, "kind": "report", "seconds": 0.5}]
    trace = trace_of(tasks, {"app": fixed_pool(4, default_duration=7.0)})
    variants = parse_policy_file("[durations]\nother = 2.0").variants_for(trace.policy)
    result = replay(trace, variants[0], kind_durations={"other": 2.0})
    ran = [(result.end[i] - result.first_start[i]) / NS for i in range(4)]
    assert ran == [0.5, 3.0, 2.0, 0.5]    # the kind's median, the hint, the file's figure, recorded
    assert result.modelled_attempts == 3
    no_hint = trace_of([{"task": 1, "at": 0.0, "kind": "new"}], {"app": fixed_pool(1, default_duration=7.0)})
    result = replay(no_hint, parse_policy_file("").variants_for(no_hint.policy)[0])
    assert (result.end[0] - result.first_start[0]) / NS == 7.0    # the pool's default


def test_an_aborted_attempt_is_stopped_again_by_its_timeout():
    tasks = [{"task": 1, "at": 0.0, "timeout": 1.0, "retry": {"max_attempts": 2, "initial_backoff": 0},
              "attempts": [{"seconds": 0.99, "outcome": "aborted"}]}]
    trace = trace_of(tasks, {"app": fixed_pool(1)})
    figs, results = compare(trace, "")
    r = results["recorded"]
    assert r.status == ["dead_lettered"] and r.attempts == [2] and r.totals["timeouts"] == 2


def test_a_start_delay_holds_slots_and_lengthens_waits():
    trace = trace_of(stream(50, 0.05, 0.2, kind="job"), {"app": fixed_pool(2)})
    (variant,) = parse_policy_file("").variants_for(trace.policy)
    plain = Report(trace, [replay(trace, variant)]).variants[0]
    delayed = Report(trace, [replay(trace, variant, start_delay=0.05)]).variants[0]
    assert delayed.waits["all"].p50 > plain.waits["all"].p50 + 0.05
    with pytest.raises(ValueError, match="start_delay must be"):
        replay(trace, variant, start_delay=-1)


def test_the_reservable_fraction_decides_how_many_fixed_starts_are_booked():
    busy = stream(60, 0.0, 2.0, kind="batch", priority="low")
    booked = [{"task": f"n{i}", "at": 0.0, "kind": "nightly", "start": 10.0, "tolerance": 1.0,
               "duration_hint": 1.0, "seconds": 1.0} for i in range(3)]
    trace = trace_of(busy + booked, {"app": fixed_pool(4, reservable_fraction=0.25)})
    figs, results = compare(trace, '''
[[variant]]
name = "a quarter"
[[variant]]
name = "all of it"
pools.app.reservable_fraction = 1.0
''')
    assert figs["a quarter"].endings[REFUSED] == 2 and figs["a quarter"].fixed_starts == 1
    assert figs["all of it"].endings[REFUSED] == 0 and figs["all of it"].fixed_starts == 3
    assert figs["all of it"].fixed_start_hit_rate == 1.0   # held slots, whatever the backlog
    assert figs["all of it"].waits["low"].mean > figs["a quarter"].waits["low"].mean   # slots held for them


def test_a_replay_that_never_settles_is_stopped():
    trace = trace_of(stream(10, 0.1, 1.0), {"app": fixed_pool(1)})
    with pytest.raises(ReplayError, match="did not settle within 5 steps"):
        replay(trace, parse_policy_file("").variants_for(trace.policy)[0], max_steps=5)
