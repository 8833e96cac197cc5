"""The leader's history of its pools ([history], GET /v1/history, Admin.History):
the configuration, the rings and their bounds, downsampling, and the answers
of real servers (alone, and sharded)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import grpc
import httpx
import pytest

from cronoq._proto import cronoq_pb2 as pb
from cronoq.core import PoolConfig, TaskSpec
from cronoq.server.config import ConfigError, HistorySection, PoolSection, parse
from cronoq.server.history import BYTES_PER_SAMPLE, SERIES, History, PoolRing, buckets, downsample
from dashkit import api, capacity, wait_until
from enginekit import S, dispatches, drain, make_core
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, bearer, shards_toml, stubs

FAST = """
[history]
interval_s = 0.2
kept_s = 60
"""

CONFIG = LISTEN + AUTH + FAST + """
[[pools]]
name = "default"
[[pools]]
name = "reports"
"""


# ---------------------------------------------------------------- configuration


def test_the_history_section_has_defaults_and_reads_its_keys():
    assert parse("").history == HistorySection(1.0, 3600.0, 1000)
    assert parse("").history.samples == 3600
    section = parse("[history]\ninterval_s = 0.5\nkept_s = 10\nevents = 50\n").history
    assert (section.interval_s, section.kept_s, section.events, section.samples) == (0.5, 10.0, 50, 20)


@pytest.mark.parametrize("text,error", [
    ("interval_s = 0", "history.interval_s: must be at least 0.1"),
    ("interval_s = 'fast'", "history.interval_s: must be a number of seconds"),
    ("kept_s = 0.5", "history.kept_s: must be at least 1"),
    ("interval_s = 10\nkept_s = 5", "history.kept_s: must be at least interval_s (10), got 5"),
    ("interval_s = 0.1\nkept_s = 604800", "history.kept_s: keeps 6048000 samples a pool"),
    ("events = -1", "history.events: must be between 0 and 1000000"),
    ("samples = 5", "history.samples: unknown key"),
])
def test_the_history_section_refuses_what_is_wrong_naming_the_key(text, error):
    with pytest.raises(ConfigError) as caught:
        parse("[history]\n" + text + "\n")
    assert error in str(caught.value)


def test_the_leaders_recent_events_follow_history_events():
    from cronoq.server.service import Service
    service = Service(parse("[history]\nevents = 7\n"), hub=SimpleNamespace())   # type: ignore[arg-type]
    assert service.recent.events.maxlen == 7


# ---------------------------------------------------------------- rings and downsampling


def test_a_ring_keeps_its_last_samples_in_fixed_arrays():
    ring = PoolRing(5)
    assert len(ring) == 0 and ring.ordered(ring.t) == []
    for i in range(12):
        ring.append(1000.0 * i, [float(i)] * len(SERIES))
    assert len(ring) == 5 and ring.seq == 12 and ring.first_seq() == 7
    assert ring.ordered(ring.t) == [7000.0, 8000.0, 9000.0, 10000.0, 11000.0]
    assert ring.ordered(ring.series[0]) == [7.0, 8.0, 9.0, 10.0, 11.0]
    # The arrays never grow: what a sample costs is fixed.
    assert all(len(column) == 5 and column.itemsize == 8 for column in ring.series) and len(ring.t) == 5
    assert BYTES_PER_SAMPLE == 8 * (1 + len(SERIES)) == 184


def test_buckets_are_at_most_points_and_aligned_on_sample_numbers():
    assert buckets(0, 0, 10) == []
    assert buckets(3, 4, 10) == [(0, 1), (1, 2), (2, 3), (3, 4)]   # fewer samples than points: one each
    assert buckets(0, 10, 1) == [(0, 10)]
    for first in range(0, 7):
        for n in (11, 50, 3600):
            for points in (2, 3, 10, 720):
                spans = buckets(first, n, points)
                assert len(spans) <= points
                assert spans[0][0] == 0 and spans[-1][1] == n
                assert all(a < b and b == c for (a, b), (c, _) in zip(spans, spans[1:]))
    # The same samples fall in the same buckets when the window moves on by one sample.
    width = 3   # 10 samples into 5 points: ceil(10 / 4)
    assert buckets(0, 10, 5) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert buckets(1, 10, 5) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert all((1 + a) % width == 0 for a, _ in buckets(1, 10, 5)[1:])


def test_downsampling_takes_the_mean_the_max_or_the_last():
    values = [1.0, 3.0, 2.0, 10.0, 0.0, 5.0]
    spans = [(0, 3), (3, 6)]
    assert downsample(values, spans, "mean") == [2.0, 5.0]
    assert downsample(values, spans, "max") == [3.0, 10.0]
    assert downsample(values, spans, "last") == [2.0, 5.0]
    how = dict(SERIES)
    assert [name for name, rule in SERIES if rule == "max"] == [
        "busy", "held", "pending", "pending_critical", "pending_high", "pending_normal", "pending_low"]
    assert how["cost"] == "last" and how["capacity"] == how["wait_p99_s"] == "mean"


def _event(pool: str, status: str, stage=None):
    return SimpleNamespace(pool=pool, status=status, stage=stage)


def test_samples_come_from_the_engines_snapshot_and_the_status_events():
    core = make_core(PoolConfig("default", max=4, initial=0, autoscale=False))
    history = History(HistorySection(1.0, 10.0, 10), [PoolSection("default", min=2)])
    history._started_ms = 0.0
    for i in range(3):
        core.submit(0, TaskSpec(("low", i), priority="low"))
    core.submit(0, TaskSpec("urgent", priority="critical"))
    history.sample(core.snapshot(0), t_ms=1000.0)
    core.set_capacity(5 * S, "default", 4)
    assert len(dispatches(drain(core))) == 4
    for status in ("succeeded", "succeeded", "retrying", "dead_lettered", "cancelled"):
        history.deliver(_event("default", status))
    history.deliver(_event("default", "running", stage="chunk"))   # (a checkpoint: no attempt ended)
    history.deliver(_event("elsewhere", "succeeded"))              # (a pool it does not keep)
    history.sample(core.snapshot(5 * S), t_ms=3000.0)
    answer = history.answer(["default"], 0.0, 720)
    [pool] = answer.pools
    assert list(pool.t_unix_ms) == [1000, 3000]
    assert list(pool.capacity) == [0.0, 4.0]
    assert list(pool.desired) == [2.0, 4.0]          # at least the pool's min, as the snapshot says
    assert list(pool.pending) == [4.0, 0.0] and list(pool.busy) == [0.0, 4.0]
    assert list(pool.pending_by_class.low) == [3.0, 0.0] and list(pool.pending_by_class.critical) == [1.0, 0.0]
    assert list(pool.throughput_per_s) == [0.0, 1.0]   # 2 successes over 2 s
    assert list(pool.failures_per_s) == [0.0, 1.0]     # retrying and dead-lettered: 2 failed attempts over 2 s
    assert pool.wait_p50_s[1] == pytest.approx(5, rel=0.1)
    assert pool.wait_p50_s_by_class.critical[1] == pytest.approx(5, rel=0.1)
    assert list(pool.wait_p50_s_by_class.high) == [0.0, 0.0]
    assert answer.interval_s == 1.0 and answer.kept_s == 10.0


def test_a_range_and_points_select_and_average_the_latest_samples():
    history = History(HistorySection(1.0, 100.0, 10), [PoolSection("default")])
    for i in range(150):   # more than it keeps: the oldest 50 are gone
        snap = SimpleNamespace(pools=[SimpleNamespace(
            name="default", capacity=i, desired=i, busy=i % 7, held=0, pending=0,
            pending_by_class={"critical": 0, "high": 0, "normal": 0, "low": 0}, wait_p50=0.0, wait_p99=0.0,
            wait_p50_s_by_class=[0.0] * 4, wait_p99_s_by_class=[0.0] * 4, cost=float(i))])
        history.sample(snap, t_ms=1000.0 * i)   # type: ignore[arg-type]
    everything = history.pool_history("default", 0.0, 720, 149_000.0)
    assert len(everything.t_unix_ms) == 100 and everything.t_unix_ms[0] == 50_000
    latest = history.pool_history("default", 10.0, 720, 149_000.0)
    assert list(latest.t_unix_ms) == [1000 * i for i in range(139, 150)]
    few = history.pool_history("default", 0.0, 10, 149_000.0)
    assert len(few.t_unix_ms) <= 10 and few.t_unix_ms[-1] == 149_000
    assert few.cost[-1] == 149.0                                   # the last sample of its bucket
    assert max(few.busy) == 6.0                                    # a peak survives
    assert min(few.capacity) > 50 and max(few.capacity) < 149      # means of their buckets


# ---------------------------------------------------------------- a real server


def _history(http: httpx.Client, **params):
    response = http.get("/v1/history", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _successes(pool) -> float:
    """The successes a pool's throughput series stands for: each rate times the time since the sample before."""
    t = pool["t_unix_ms"]
    return sum(rate * (t[i + 1] - t[i]) / 1e3 for i, rate in enumerate(pool["throughput_per_s"][1:]))


def test_the_route_answers_the_pools_history_under_the_metrics_role(servers, workers):
    server = servers(CONFIG, name="history")
    workers(server.target, slots=2)
    with api(server, METRICS) as http, api(server, CLIENT) as client:
        wait_until(lambda: capacity(http) == 2, what="the worker connecting")
        for _ in range(4):
            client.post("/v1/tasks", json={"payload": {"sleep": 0.1}, "priority": "high"})
        wait_until(lambda: _successes(_history(http, pool="default")["pools"][0]) == pytest.approx(4, abs=0.05),
                   what="the 4 successes reaching the history")
        answer = _history(http)
        assert (answer["interval_s"], answer["kept_s"], answer["unavailable_shards"]) == (0.2, 60.0, [])
        assert int(answer["at_unix_ns"]) > 0
        assert [p["name"] for p in answer["pools"]] == ["default", "reports"]
        pool = answer["pools"][0]
        n = len(pool["t_unix_ms"])
        assert n >= 2 and pool["t_unix_ms"] == sorted(pool["t_unix_ms"])
        for name in ("capacity", "desired", "busy", "held", "pending", "throughput_per_s", "failures_per_s",
                     "wait_p50_s", "wait_p99_s", "cost"):
            assert len(pool[name]) == n, name
        for name in ("pending_by_class", "wait_p50_s_by_class", "wait_p99_s_by_class"):
            assert sorted(pool[name]) == ["critical", "high", "low", "normal"]
            assert all(len(series) == n for series in pool[name].values())
        assert pool["capacity"][-1] == 2
        assert sum(pool["failures_per_s"]) == 0 and max(pool["busy"]) >= 1
        # Fewer points, a shorter range, one pool.
        few = _history(http, pool="default", points=3)["pools"][0]
        assert 1 <= len(few["t_unix_ms"]) <= 3 and few["t_unix_ms"][-1] >= pool["t_unix_ms"][-1]
        short = _history(http, pool="reports", range_s=0.5)["pools"]
        assert [p["name"] for p in short] == ["reports"] and 1 <= len(short[0]["t_unix_ms"]) <= 4
        # Refusals: a client token, an unknown pool, a bad query.
        assert client.get("/v1/history").status_code == 403
        assert http.get("/v1/history", params={"pool": "nope"}).status_code == 404
        bad = http.get("/v1/history", params={"points": 0})
        assert bad.status_code == 400 and "points" in bad.json()["error"]
        assert http.get("/v1/history", params={"range_s": -1}).status_code == 400
    with api(server, ADMIN) as admin:
        assert admin.get("/v1/history").status_code == 200


async def _admin_call(target: str, method: str, request, token: str):
    channel, _, admin = stubs(target)
    try:
        return await getattr(admin, method)(request, metadata=bearer(token), timeout=30)
    finally:
        await channel.close()


@pytest.mark.asyncio
async def test_the_grpc_history_answers_as_the_route_does(servers):
    server = servers(CONFIG, name="history-grpc")
    with api(server, METRICS) as http:
        wait_until(lambda: len(_history(http)["pools"][0]["t_unix_ms"]) >= 2, what="two samples")
    answer = await _admin_call(server.target, "History", pb.HistoryRequest(pools=["reports"], points=5), METRICS)
    assert [p.name for p in answer.pools] == ["reports"] and answer.interval_s == 0.2
    assert 1 <= len(answer.pools[0].t_unix_ms) <= 5
    assert len(answer.pools[0].pending_by_class.low) == len(answer.pools[0].t_unix_ms)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _admin_call(server.target, "History", pb.HistoryRequest(), CLIENT)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _admin_call(server.target, "History", pb.HistoryRequest(range_s=float("nan")), METRICS)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "range_s" in refused.value.details()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded(ports: dict[str, int], shard: str) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{ports[shard]}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
{AUTH}{FAST}
""" + shards_toml({"a": (["default"], f"http://127.0.0.1:{ports['a']}"),
                   "b": (["gpu"], f"http://127.0.0.1:{ports['b']}"),
                   "down": (["spare"], f"http://127.0.0.1:{ports['down']}")})


def test_a_sharded_servers_history_holds_every_shards_pools(servers):
    ports = {"a": _free_port(), "b": _free_port(), "down": _free_port()}   # (nothing serves "down")
    a = servers(_sharded(ports, "a"), args=("--shard", "a"), name="a")
    servers(_sharded(ports, "b"), args=("--shard", "b"), name="b")
    with api(a, METRICS) as http:
        wait_until(lambda: all(len(p["t_unix_ms"]) >= 2 for p in _history(http)["pools"]), what="samples")
        answer = _history(http)
        assert [p["name"] for p in answer["pools"]] == ["default", "gpu"]
        assert answer["unavailable_shards"] == ["down"]
        only_b = _history(http, pool="gpu", points=2)
        assert [p["name"] for p in only_b["pools"]] == ["gpu"] and len(only_b["pools"][0]["t_unix_ms"]) <= 2


class _FakeScheduler:
    """What Service.lead uses of a scheduler: sinks and a snapshot."""

    running = True

    def __init__(self, core):
        self.core = core
        self.sinks: list = []

    def subscribe(self, sink):
        self.sinks.append(sink)

    def unsubscribe(self, sink):
        self.sinks.remove(sink)

    async def snapshot(self):
        return self.core.snapshot(0)

    def events(self):   # (Service._follow's stream: none here)
        class _Empty:
            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc):
                return False

            def __aiter__(self):
                return self

            async def __anext__(self):
                raise StopAsyncIteration
        return _Empty()


@pytest.mark.asyncio
async def test_a_server_that_becomes_the_leader_starts_an_empty_history():
    import asyncio
    from cronoq.server.service import Service

    service = Service(parse("[history]\ninterval_s = 0.1\nkept_s = 10\n"),
                      hub=SimpleNamespace())   # type: ignore[arg-type]
    first = _FakeScheduler(make_core(PoolConfig("default", max=1, initial=1, autoscale=False)))
    service.lead(first)   # type: ignore[arg-type]
    history = service.history
    assert history is not None and history in first.sinks
    while len(history.rings["default"]) < 2:
        await asyncio.sleep(0.05)
    service.step_down()
    assert service.history is None and history not in first.sinks
    second = _FakeScheduler(make_core(PoolConfig("default", max=1, initial=1, autoscale=False)))
    service.lead(second)   # type: ignore[arg-type]
    assert service.history is not history and len(service.history.rings["default"]) == 0
    service.step_down()
