"""Server pools ask for capacity: the library's queue-pressure autoscaler runs
on each server pool, its target is ``desired`` (snapshots, HTTP, /metrics)
while capacity stays the slots of connected workers, and a webhook scaler
POSTs it when it changes (docs/server.md, "Pools and autoscaling")."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time

import httpx
import pytest

from cronoq.core.types import AutoscaleConfig
from cronoq.server.config import AutoscaleSection, ConfigError, parse
from cronoq.server.scalers import WebhookScaler
from serverkit import ADMIN, AUTH, LISTEN, METRICS, WORKER, RawWorker

WEBHOOK_TOKEN = "webhook-token-0123456789abcdef0123"


def test_the_autoscale_table_has_the_librarys_keys_and_defaults():
    policy = AutoscaleSection().policy()
    library = AutoscaleConfig()
    assert {name: getattr(policy, name) for name in AutoscaleConfig.__slots__} == \
        {name: getattr(library, name) for name in AutoscaleConfig.__slots__}
    config = parse('[[pools]]\nname = "a"\nautoscale = { target_utilization = 0.5, slo = { high = 2 } }\n'
                   '[[pools]]\nname = "b"\nautoscale = false\n'
                   '[[pools]]\nname = "c"\nscaler = { kind = "webhook", url = "https://scale.example/cronoq", '
                   'token_env = "T" }\n')
    a, b, c = config.pools
    assert a.autoscale is not None and a.autoscale.policy().target_utilization == 0.5
    assert a.autoscale.policy().slo == (None, 2.0, None, None) and a.scaler.kind == "external"
    assert b.autoscale is None
    assert c.scaler.kind == "webhook" and c.scaler.url == "https://scale.example/cronoq" and c.scaler.token_env == "T"


@pytest.mark.parametrize("pool, expected", [
    ('autoscale = { interval_s = 0 }', "pools[0].autoscale.interval_s: must be above 0"),
    ('autoscale = { target_utilization = 1.5 }', "pools[0].autoscale.target_utilization: must be"),
    ('autoscale = { slo = { urgent = 1 } }', "pools[0].autoscale.slo.urgent: unknown key"),
    ('autoscale = { drain = 1 }', "pools[0].autoscale.drain: unknown key"),
    ('scaler = { kind = "hpa" }', "pools[0].scaler.kind: must be one of"),
    ('scaler = { kind = "webhook" }', "pools[0].scaler.url: is required with kind = \"webhook\""),
    ('scaler = { kind = "webhook", url = "ftp://x/y" }', "pools[0].scaler.url: must be an http:// or https:// URL"),
    ('scaler = { kind = "webhook", url = "http://scale.example/x", token_env = "T" }',
     "pools[0].scaler.url: would send the token of T over plain http to scale.example"),
    ('scaler = { url = "https://scale.example/x" }', "pools[0].scaler.kind: url and token_env need kind"),
])
def test_bad_autoscale_and_scaler_keys_are_refused_naming_the_key(pool, expected):
    with pytest.raises(ConfigError) as caught:
        parse(f'[[pools]]\nname = "a"\n{pool}\n')
    assert expected in str(caught.value)


class Receiver:
    """A webhook on a free loopback port: records each POST; answers 500 to the first ``fail`` of them."""

    def __init__(self, fail: int = 0) -> None:
        self.posts: list[tuple[dict, str | None]] = []
        self.fail = fail
        self.arrived = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with receiver.arrived:
                    failing = receiver.fail > 0
                    receiver.fail -= failing
                    receiver.posts.append((body, self.headers.get("authorization")))
                    receiver.arrived.notify_all()
                self.send_response(500 if failing else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/scale"
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def wait_for(self, check, timeout: float = 30.0) -> list[tuple[dict, str | None]]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not check(self.posts):
                left = deadline - time.monotonic()
                assert left > 0, f"the webhook did not get what was expected: {self.posts}"
                self.arrived.wait(left)
            return list(self.posts)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(10)


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(fail: int = 0) -> Receiver:
        made.append(Receiver(fail))
        return made[-1]

    yield make
    for r in made:
        r.close()


def config(url: str) -> str:
    # Quick evaluations, a short window and cooldown: the test sees a rise and a fall in seconds.
    return LISTEN + AUTH + f"""
[[pools]]
name = "default"
min = 1
max = 64
default_duration_s = 2
autoscale = {{ interval_s = 0.2, drain_time_s = 2, stabilization_window_s = 1, cooldown_s = 0.2, max_step_down = 64 }}
scaler = {{ kind = "webhook", url = "{url}", token_env = "CRONOQ_TEST_WEBHOOK_TOKEN" }}
[[pools]]
name = "fixed"
autoscale = false
"""


def snapshot(http_client: httpx.Client) -> dict[str, dict]:
    return {p["name"]: p for p in http_client.get("/v1/snapshot").json()["pools"]}


def wait_until(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.asyncio
async def test_desired_follows_queue_pressure_while_capacity_stays_the_workers_slots(servers, receiver):
    hook = receiver(fail=1)
    server = servers(config(hook.url), env={"CRONOQ_TEST_WEBHOOK_TOKEN": WEBHOOK_TOKEN})
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30,
                      headers={"authorization": f"Bearer {ADMIN}"}) as http_client:
        # A new leader tells the webhook what it asks for at once: min (the first POST failed: retried).
        posts = hook.wait_for(lambda p: any(body == {"pool": "default", "desired": 1} for body, _ in p[1:]))
        assert posts[0][0] == {"pool": "default", "desired": 1}
        assert all(auth == f"Bearer {WEBHOOK_TOKEN}" for _, auth in posts)
        assert {body["pool"] for body, _ in posts} == {"default"}   # a pool without a webhook is not posted
        worker = RawWorker(server.target, WORKER)
        await worker.register("default", slots=2)
        batch = http_client.post("/v1/tasks:batch", json={"tasks": [{"key": f"burst-{i}"} for i in range(40)]})
        assert batch.status_code == 200, batch.text
        ids = [t["id"] for t in batch.json()["tasks"]]
        pools = wait_until(lambda: (s := snapshot(http_client))["default"]["desired"] > 10 and s, "desired to rise")
        assert pools["default"]["capacity"] == 2   # the worker's slots: the autoscaler only asks
        assert pools["fixed"]["desired"] == pools["fixed"]["capacity"] == 0   # autoscale = false
        high = hook.wait_for(lambda p: max(body["desired"] for body, _ in p) > 10)
        assert all(b["desired"] <= 64 for b, _ in high)
        scrape = httpx.get(f"http://127.0.0.1:{server.http_port}/metrics",
                           headers={"authorization": f"Bearer {METRICS}"}, timeout=30).text
        desired_line = next(line for line in scrape.splitlines()
                            if line.startswith('cronoq_pool_desired_workers{pool="default"}'))
        assert float(desired_line.split()[-1]) > 1
        for task_id in ids:   # the burst goes away: desired falls back to min after the window
            assert http_client.delete(f"/v1/tasks/{task_id}").status_code == 200
        await worker.close()
        wait_until(lambda: snapshot(http_client)["default"]["desired"] == 1, "desired to fall back to min")
        hook.wait_for(lambda p: p[-1][0] == {"pool": "default", "desired": 1} and len(p) > len(high))


@pytest.mark.asyncio
async def test_the_webhook_scaler_sends_only_the_latest_value_and_retries_with_backoff():
    sent: list[int] = []
    failures = [2]
    gate = threading.Event()

    def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
        gate.wait(10)
        if failures[0]:
            failures[0] -= 1
            raise OSError("connection refused")
        sent.append(json.loads(body)["desired"])
        return 200

    scaler = WebhookScaler("default", "http://127.0.0.1:9/x", None, 1.0, post=post)
    try:
        for value in (3, 4, 5):   # while the first attempt hangs, the value moves twice
            scaler.desired(value)
            await asyncio.sleep(0.01)
        gate.set()
        while scaler.sent != 5:
            await asyncio.sleep(0.02)
        assert sent == [5] and scaler.failures == 0   # 3 and 4 were never sent: they were out of date
        scaler.desired(5)                             # unchanged: nothing to send
        await asyncio.sleep(0.05)
        assert sent == [5]
    finally:
        await scaler.close()
