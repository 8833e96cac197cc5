"""Policy files of cronoq.whatif: parsing, laying variants over the recorded
policy, and errors that name the key."""

import pytest

import cronoq
from cronoq.core import CoreConfig, PoolConfig, PriorityConfig, ResourceConfig
from cronoq.whatif import PolicyError, parse_policy_file
from cronoq.whatif.policy import build, policy_of

RECORDED = policy_of(
    [PoolConfig("app", min=2, max=16, autoscale=cronoq.AutoscaleConfig(slo={"high": 0.5}), max_pending=100,
                overflow="reject"),
     PoolConfig("llm", min=1, max=4, autoscale=False, retry=cronoq.RetryPolicy(max_attempts=5))],
    [ResourceConfig.token_bucket("llm-api", rate=8.0, burst=4), ResourceConfig.semaphore("db", 3)],
    CoreConfig(priority=PriorityConfig(aging_rate=(1, 2, 3, 4)), seed=9))


def test_the_recorded_policy_builds_back_to_the_same_configuration():
    config, pools, resources = build(RECORDED, seed=9)
    app, llm = pools
    assert (app.min, app.max, app.autoscale.slo[1], app.max_pending_total, app.overflow) == (2, 16, 0.5, 100, "reject")
    assert llm.autoscale is None and llm.retry.max_attempts == 5
    assert [(r.name, r.kind, r.rate, r.burst, r.permits) for r in resources] == [
        ("llm-api", "token_bucket", 8.0, 4, None), ("db", "semaphore", None, None, 3)]
    assert config.priority.aging_rate == (1, 2, 3, 4) and config.seed == 9
    assert policy_of(pools, resources, config) == RECORDED   # (metrics settings are the replay's own)


def test_variants_change_the_recorded_policy_table_by_table():
    policies = parse_policy_file('''
[replay]
durations = "sampled"
seed = 4

[durations]
report = 0.6

[base]
pools.app.max = 20

[[variant]]
name = "as recorded"

[[variant]]
name = "bigger"
seed = 5
pools.app.autoscale.slo = { normal = 2.0 }
pools.app.max_pending = false
pools.llm.autoscale = { cost_per_worker_second = 0.01 }
resources.llm-api.rate = 16
priority.base = { low = 5000 }
priority.aging_rate = [0, 0, 0, 10]
''')
    assert policies.kind_durations == {"report": 0.6}
    recorded, bigger = policies.variants_for(RECORDED)
    assert (recorded.name, recorded.durations, recorded.seed) == ("as recorded", "sampled", 4)
    assert recorded.policy["pools"]["app"]["max"] == 20 and recorded.changes == {}
    config, pools, resources = bigger.build()
    app, llm = pools
    assert app.max == 20 and app.autoscale.slo[1] == 0.5 and app.autoscale.slo[2] == 2.0   # merged
    assert app.max_pending_total is None                                                      # undone
    assert llm.autoscale.cost_per_worker_second == 0.01 and llm.autoscale.interval == 1.0      # turned on
    assert resources[0].rate == 16 and resources[0].burst == 4
    assert config.priority.base == (10000, 1000, 100, 5000) and config.priority.aging_rate == (0, 0, 0, 10)
    assert bigger.seed == 5 and config.seed == 5


def test_without_a_seed_the_recorded_one_is_used_and_without_variants_the_recorded_policy():
    (only,) = parse_policy_file("").variants_for(RECORDED)
    assert (only.name, only.seed, only.durations) == ("recorded", 9, "trace")


@pytest.mark.parametrize("text,message", [
    ("[[variant]]\nname = 'x'\npools.app.maxx = 3", "variant 'x'.pools.app: unknown key 'maxx'"),
    ("[[variant]]\nname = 'x'\npools.app.max = 0", "variant 'x'.pools.app: max must be >= 1, got 0"),
    ("[[variant]]\nname = 'x'\npools.app.min = 30", "min (30) must not exceed max (16)"),
    ("[[variant]]\nname = 'x'\npools.app.overflow = 'drop'", "overflow must be one of"),
    ("[[variant]]\nname = 'x'\npools.app.autoscale.slo = { urgent = 1 }", "slo key must be a Priority"),
    ("[[variant]]\nname = 'x'\npools.app.retry.max_attempts = 0", "pools.app.retry: max_attempts must be >= 1"),
    ("[[variant]]\nname = 'x'\nresources.db.rate = 3", "resources.db: a semaphore has no rate"),
    ("[[variant]]\nname = 'x'\nresources.llm-api.burst = 0", "resources.llm-api: burst must be >= 1"),
    ("[[variant]]\nname = 'x'\npriority.base = [1, 2]", "priority.base must be four numbers"),
    ("[[variant]]\nname = 'x'\npriority.aging_rate = { urgent = 1 }", "unknown class 'urgent'"),
    ("[[variant]]\nname = 'x'\nspeed = 2", "unknown key 'speed'"),
    ("[[variant]]\nname = 'x'\ndurations = 'guessed'", "durations must be one of trace, sampled"),
    ("[[variant]]\npools.app.max = 3", "every variant needs a name"),
    ("[[variant]]\nname = 'x'\n[[variant]]\nname = 'x'", "the name 'x' is used twice"),
    ("[replay]\nseed = 'one'", "[replay] seed must be an integer"),
    ("[durations]\nreport = -1", "[durations] report must be a number of seconds >= 0"),
    ("[base]\npool.app.max = 3", "[base]: unknown key 'pool'"),
    ("colour = 1", "unknown key 'colour'"),
    ("variant = 3", "variants are written [[variant]]"),
    ("[[variant]\nname = 'x'", "not valid TOML"),
])
def test_bad_policy_files_name_the_key(text, message):
    with pytest.raises(PolicyError) as info:
        parse_policy_file(text, "p.toml").variants_for(RECORDED)
    assert message in str(info.value)
    assert str(info.value).startswith(("p.toml", "variant", "policy"))


def test_a_policy_without_pools_says_where_to_give_them():
    with pytest.raises(PolicyError, match=r"names no pool: record the trace .* \[base\] table"):
        parse_policy_file("").variants_for(None)
    (variant,) = parse_policy_file("[base]\npools.default.max = 3").variants_for(None)
    assert variant.build()[1][0].max == 3


def test_a_pool_that_does_not_autoscale_starts_at_its_live_capacity_while_it_had_work():
    from cronoq.whatif.policy import with_live_capacity

    idle = (0, 0, 0, 0)
    samples = [(0, {"app": (2, 2, 0, 0), "llm": (0, 0, 0, 0)}),            # before the workers came
               (1, {"app": (4, 4, 4, 9), "llm": (3, 3, 3, 0)}),
               (2, {"app": (16, 16, 2, 0), "llm": (3, 3, 1, 2)}),
               (3, {"app": (16, 16, 0, 1), "llm": (9, 9, 0, 1)}),            # above its max of 4
               (4, {"app": (16, 16, 0, 0), "llm": idle})]                    # after they left
    policy, changed = with_live_capacity(RECORDED, samples)
    assert changed == {"llm": 3}                       # the median of 3, 3 and 9, while it had work
    assert policy["pools"]["llm"]["initial"] == 3
    assert policy["pools"]["app"] == RECORDED["pools"]["app"]          # autoscaled: the engine decides
    assert RECORDED["pools"]["llm"]["initial"] == 1                     # (the recorded policy is untouched)
    steady = [(t, {"llm": (1, 1, 1, 0)}) for t in range(3)]            # as recorded: nothing to change
    assert with_live_capacity(RECORDED, steady)[1] == {}
    crowded = [(t, {"llm": (9, 9, 9, 0)}) for t in range(3)]           # more than its max of 4
    assert with_live_capacity(RECORDED, crowded)[1] == {"llm": 4}
    assert with_live_capacity(RECORDED, []) == (RECORDED, {})
    assert with_live_capacity(None, samples) == (None, {})
