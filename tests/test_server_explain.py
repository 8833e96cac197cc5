"""Tasks.Explain and GET /v1/tasks/{id}:explain against a real cronoq-server
with real workers: one task waiting for each reason (dependencies, an awaited
key, a fixed start, a retry backoff, worker labels, a resource, a held slot,
fair share, a full pool, a pool without workers), explained alike over gRPC
(cronoq.client), HTTP, the command line (cronoq explain) and MCP's
explain_task, with Get's authorization (pool scope, tenant pinning) and Get's
gains (labels, deps)."""

from __future__ import annotations

import json
import time

import pytest

import cronoq
from cronoq.client import BlockingClient, Client
from clikit import cronoq as run_cronoq
from clikit import err
from httpkit import client as http_client
from mcpkit import start_worker, stdio_session, structured
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER

SCOPED = "scoped-client-token-0123456789abcd"
TENANT_B = "tenant-b-client-token-0123456789ab"

CONFIG = LISTEN + AUTH + f"""
[[auth.tokens]]
token = "{SCOPED}"
role = "client"
pools = ["idle"]
[[auth.tokens]]
token = "{TENANT_B}"
role = "client"
tenant = "b"

[[pools]]
name = "busy"
fair_share = true
[[pools]]
name = "free"
[[pools]]
name = "idle"
[[pools]]
name = "awaiting"
unknown_dependency = "await"

[[resources]]
name = "gpu"
kind = "semaphore"
permits = 1
"""

BLOCK = {"sleep": 3600}
PATIENCE = 120.0

# The task of each scenario: (status, reason codes) as every surface must report them.
EXPECTED = {
    "running": ("running", []),
    "share": ("ready", ["fair_share", "pool_full"]),
    "full": ("ready", ["pool_full"]),
    "retry": ("retrying", ["start_time"]),
    "parked": ("ready", ["resource"]),
    "labels": ("ready", ["labels"]),
    "held": ("scheduled", ["start_time", "hold"]),
    "later": ("scheduled", ["start_time"]),
    "child": ("blocked", ["dependencies"]),
    "awaits": ("blocked", ["awaiting_key"]),
    "nobody": ("ready", ["pool_full"]),
}


def _until(predicate, what: str):
    deadline = time.monotonic() + PATIENCE
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited too long for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="explain")


@pytest.fixture(scope="module")
def scenario(server):
    """Two worker processes (4 slots each, pools busy and free), and the
    tasks of EXPECTED by name, each settled in its status."""
    workers = [start_worker(server.target, WORKER, "busy"), start_worker(server.target, WORKER, "free")]
    try:
        with BlockingClient(server.target, token=ADMIN) as admin:
            _until(lambda: len(admin.workers()) == 2, "the workers")
            ids: dict[str, int] = {}
            blockers = [admin.submit(BLOCK, pool="busy").id for _ in range(4)]
            _until(lambda: all(admin.get(i).status == "running" for i in blockers), "the busy pool to fill")
            admin.submit({"n": 1}, pool="busy", tenant="a")
            ids["share"] = admin.submit({"n": 2}, pool="busy", tenant="a").id
            ids["full"] = admin.submit({"n": 3}, pool="busy", tenant="b").id
            ids["running"] = admin.submit(BLOCK, pool="free", resources={"gpu": 1}).id
            _until(lambda: admin.get(ids["running"]).status == "running", "the resource holder")
            ids["parked"] = admin.submit({"n": 4}, pool="free", resources={"gpu": 1}).id
            ids["retry"] = admin.submit({"fail": "retryable"}, pool="free",
                                        retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=3600,
                                                                 jitter=False)).id
            ids["labels"] = admin.submit({"n": 5}, pool="free", labels={"gpu": "a100"}).id
            ids["held"] = admin.submit({"n": 6}, pool="free", start_in=200, tolerance=300).id
            ids["later"] = admin.submit({"n": 7}, pool="free", start_in=3600, tolerance=1).id
            admin.submit({"n": 8}, pool="idle", key="explain-parent")
            ids["child"] = admin.submit({"n": 9}, pool="free", after="explain-parent", labels={"zone": "eu"}).id
            ids["awaits"] = admin.submit({"n": 10}, pool="awaiting", after="explain-never-submitted").id
            ids["nobody"] = admin.submit({"n": 11}, pool="idle").id
            _until(lambda: admin.get(ids["retry"]).status == "retrying", "the retry")
            yield ids
    finally:
        for worker in workers:   # (their tasks sleep for an hour: no drain)
            worker.process.kill()
            worker.process.wait(30)


def _normal(document: dict) -> tuple[str, list[str]]:
    return document["status"], [r["code"] for r in document["reasons"]]


def _check_all(explained: dict[str, dict]) -> None:
    for name, (status, codes) in EXPECTED.items():
        assert _normal(explained[name]) == (status, codes), (name, explained[name])
    # The figures each reason carries.
    share = explained["share"]
    assert share["reasons"][0]["detail"]["tenant"] == "a" and share["reasons"][0]["detail"]["ahead"] == ["b"]
    assert (explained["full"]["position"], explained["share"]["position"]) == (2, 3)
    assert explained["full"]["reasons"][0]["detail"]["busy"] == 4
    retry = explained["retry"]["reasons"][0]["detail"]
    assert retry["kind"] == "retry" and retry["attempt"] == 1 and retry["at"] > time.time()
    parked = explained["parked"]["reasons"][0]["detail"]
    assert (parked["resource"], parked["units"], parked["available"], parked["position"]) == ("gpu", 1, 0, 1)
    labels = explained["labels"]["reasons"][0]
    assert labels["detail"]["labels"] == {"gpu": "a100"} and "carries the labels gpu=a100" in labels["message"]
    assert explained["held"]["reasons"][0]["detail"]["kind"] == "fixed_start"
    unmet = explained["child"]["reasons"][0]["detail"]["unmet"]
    assert [(d["key"], d["status"], d["condition"]) for d in unmet] == [("explain-parent", "ready", "success")]
    assert explained["awaits"]["reasons"][0]["detail"]["keys"] == ["explain-never-submitted"]
    assert explained["nobody"]["reasons"][0]["detail"]["capacity"] == 0
    assert explained["running"]["summary"].startswith("It is not waiting")


def _grpc_document(e) -> dict:
    return {"status": e.status, "position": e.position, "summary": e.summary,
            "reasons": [{"code": r.code, "message": r.message, "detail": r.detail} for r in e.reasons]}


@pytest.mark.asyncio
async def test_every_reason_over_grpc(server, scenario):
    async with Client(server.target, token=CLIENT) as client:
        explained = {name: _grpc_document(await client.explain(task)) for name, task in scenario.items()}
        _check_all(explained)
        answer = await client.explain(scenario["share"])
        assert answer.pool == "busy" and answer.priority == "normal" and answer.tenant == "a"
        assert answer.waiting and answer.score is not None and answer.queued == 3
        with pytest.raises(cronoq.UnknownTask):
            await client.explain(10 ** 12)
        with pytest.raises(cronoq.UnknownTask):
            await client.explain("explain-no-such-key")
        assert (await client.explain("explain-parent")).reasons[0].code == "pool_full"   # by key


@pytest.mark.asyncio
async def test_every_reason_over_http(server, scenario):
    async with http_client(server, CLIENT) as http:
        explained = {}
        for name, task in scenario.items():
            response = await http.get(f"/v1/tasks/{task}:explain")
            assert response.status_code == 200, response.text
            explained[name] = response.json()
        _check_all(explained)
        share = explained["share"]
        assert share["id"] == str(scenario["share"]) and share["waiting"] is True and share["at_unix_ns"].isdigit()
        assert explained["running"]["waiting"] is False and explained["running"]["reasons"] == []
        missing = await http.get("/v1/tasks/999999999999:explain")
        assert missing.status_code == 404 and "999999999999" in missing.json()["error"]
        bad = await http.get("/v1/tasks/abc:explain")
        assert bad.status_code == 400


@pytest.mark.asyncio
async def test_explain_is_authorized_like_get(server, scenario):
    # A credential limited to other pools, or pinned to another tenant, sees no such task.
    async with http_client(server, SCOPED) as scoped, http_client(server, TENANT_B) as pinned, \
            http_client(server, METRICS) as metrics:
        assert (await scoped.get(f"/v1/tasks/{scenario['child']}:explain")).status_code == 404
        assert (await scoped.get(f"/v1/tasks/{scenario['nobody']}:explain")).status_code == 200
        assert (await pinned.get(f"/v1/tasks/{scenario['share']}:explain")).status_code == 404
        assert (await pinned.get(f"/v1/tasks/{scenario['full']}:explain")).status_code == 200
        assert (await metrics.get(f"/v1/tasks/{scenario['full']}:explain")).status_code == 403
    async with Client(server.target, token=SCOPED) as client:
        with pytest.raises(cronoq.UnknownTask):
            await client.explain(scenario["child"])


def test_every_reason_over_the_command_line(server, scenario):
    explained = {}
    for name, task in scenario.items():
        result = run_cronoq("explain", str(task), "-o", "json", token=CLIENT, server=server.target)
        assert result.returncode == 0, err(result)
        explained[name] = json.loads(result.stdout)
    _check_all(explained)
    text = run_cronoq("explain", str(scenario["labels"]), token=CLIENT, server=server.target)
    assert text.returncode == 0, err(text)
    lines = text.stdout.decode().splitlines()
    assert "- labels: No connected worker of pool free carries the labels gpu=a100." in lines
    by_key = run_cronoq("explain", "--key", "explain-parent", token=CLIENT, server=server.target)
    assert by_key.returncode == 0 and "- pool_full: No worker serves pool idle" in by_key.stdout.decode()
    missing = run_cronoq("explain", "999999999999", token=CLIENT, server=server.target)
    assert missing.returncode != 0 and "999999999999" in err(missing)


@pytest.mark.asyncio
async def test_every_reason_over_mcp(server, scenario):
    pytest.importorskip("mcp")
    async with stdio_session(server.target, ADMIN) as session:
        explained = {}
        for name, task in scenario.items():
            answer = structured(await session.call_tool("explain_task", {"task": task}))
            assert answer["task"]["id"] == task
            explained[name] = {**answer, "status": answer["task"]["status"]}
        _check_all(explained)
        assert explained["share"]["pool"]["name"] == "busy" and explained["share"]["pool"]["busy"] == 4
        child = structured(await session.call_tool("get_task", {"task": scenario["child"]}))
        assert child["labels"] == {"zone": "eu"} and child["dependencies"] == [{"task": "explain-parent",
                                                                               "on": "success"}]


@pytest.mark.asyncio
async def test_get_reports_labels_and_dependencies(server, scenario):
    async with Client(server.target, token=CLIENT) as client:
        child = await client.get(scenario["child"])
        assert child.labels == {"zone": "eu"} and child.deps == [("explain-parent", "success")]
    async with http_client(server, CLIENT) as http:
        document = (await http.get(f"/v1/tasks/{scenario['child']}")).json()
        assert document["labels"] == {"zone": "eu"} and document["deps"] == [{"key": "explain-parent",
                                                                              "cond": "on_success"}]
