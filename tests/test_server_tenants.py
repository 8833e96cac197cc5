"""Tenant pinning beyond submit: a credential pinned to a tenant sees and
changes only that tenant's tasks, over gRPC and HTTP, live, retained and
stored alike; another tenant's tasks look like tasks that do not exist."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import pytest

from cronoq._proto import cronoq_pb2 as pb
from serverkit import ADMIN, AUTH, LISTEN, bearer, stubs

pytestmark = pytest.mark.asyncio

ACME = "acme-client-token-0123456789abcdefg"
GLOBEX = "globex-client-token-0123456789abcde"


def config(tmp_path) -> str:
    return LISTEN + AUTH + f"""
[[auth.tokens]]
token = "{ACME}"
role = "client"
tenant = "acme"
[[auth.tokens]]
token = "{GLOBEX}"
role = "client"
tenant = "globex"
[store]
kind = "sqlite"
path = "{tmp_path / 'tenants.db'}"
retention_s = 0.5
[[pools]]
name = "default"
[[pools]]
name = "idle"
"""


async def code_of(call) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def by_id(task_id: int) -> pb.TaskRef:
    return pb.TaskRef(id=task_id)


async def test_a_pinned_credential_sees_and_changes_only_its_tenants_tasks(servers, tmp_path):
    server = servers(config(tmp_path))
    channel, tasks, _ = stubs(server.target)
    acme, globex, admin = bearer(ACME), bearer(GLOBEX), bearer(ADMIN)
    mine = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle", key="acme-1")), metadata=acme)).id
    theirs = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle", key="globex-1")),
                                 metadata=globex)).id
    plain = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle", key="plain-1")), metadata=admin)).id
    missing = theirs + 1000
    _, nothing = await code_of(tasks.Get(pb.GetRequest(task=by_id(missing)), metadata=acme))
    for other, key in ((theirs, "globex-1"), (plain, "plain-1")):   # another tenant's, and no tenant's
        for call in (tasks.Get(pb.GetRequest(task=by_id(other)), metadata=acme),
                     tasks.Get(pb.GetRequest(task=pb.TaskRef(key=key)), metadata=acme),
                     tasks.Wait(pb.WaitRequest(task=by_id(other), timeout_s=0), metadata=acme),
                     tasks.Cancel(pb.CancelRequest(task=by_id(other)), metadata=acme),
                     tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(key=key)), metadata=acme)):
            code, details = await code_of(call)
            assert code == grpc.StatusCode.NOT_FOUND
            assert details == nothing.replace(str(missing), str(other)) or key in details   # the same message
    assert (await tasks.Get(pb.GetRequest(task=by_id(theirs)), metadata=admin)).status == pb.TASK_STATUS_READY
    listed = await tasks.ListTasks(pb.ListTasksRequest(), metadata=acme)
    assert [info.id for info in listed.tasks] == [mine] and listed.tasks[0].tenant == "acme"
    code, _ = await code_of(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle", key="globex-1")),
                                         metadata=acme))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    code, details = await code_of(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle", after=[by_id(theirs)])),
                                               metadata=acme))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no task with" in details
    # Watch: only its own tenant's events.
    seen = []
    watch = tasks.Watch(pb.WatchRequest(), metadata=acme)

    async def read() -> None:
        async for event in watch:
            seen.append(event.id)
            if event.status == pb.TASK_STATUS_CANCELLED:
                return
    reader = asyncio.create_task(read())
    await asyncio.sleep(0.3)   # (the stream is open before the events below)
    await tasks.Cancel(pb.CancelRequest(task=by_id(theirs)), metadata=globex)
    await tasks.Cancel(pb.CancelRequest(task=by_id(plain)), metadata=admin)
    await tasks.Cancel(pb.CancelRequest(task=by_id(mine)), metadata=acme)
    await asyncio.wait_for(reader, 30)
    watch.cancel()
    assert seen == [mine]
    # Ended, then gone from the engine (retention 0.5 s): the store's record keeps the tenant.
    await asyncio.sleep(1.0)
    code, _ = await code_of(tasks.Get(pb.GetRequest(task=by_id(theirs)), metadata=acme))
    assert code == grpc.StatusCode.NOT_FOUND
    assert (await tasks.Get(pb.GetRequest(task=by_id(mine)), metadata=acme)).status == pb.TASK_STATUS_CANCELLED
    # Explain answers from the store's record too: its status, nothing holding it back.
    explained = await tasks.Explain(pb.ExplainRequest(task=by_id(mine)), metadata=acme)
    assert (explained.status, explained.tenant, list(explained.reasons)) == (pb.TASK_STATUS_CANCELLED, "acme", [])
    code, _ = await code_of(tasks.Explain(pb.ExplainRequest(task=by_id(theirs)), metadata=acme))
    assert code == grpc.StatusCode.NOT_FOUND
    listed = await tasks.ListTasks(pb.ListTasksRequest(), metadata=acme)
    assert [info.id for info in listed.tasks] == [mine]
    await channel.close()


async def test_the_http_api_pins_tenants_the_same_way(servers, tmp_path):
    server = servers(config(tmp_path))
    base = f"http://127.0.0.1:{server.http_port}"
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {ACME}"}, timeout=30) as acme, \
            httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {GLOBEX}"}, timeout=30) as globex:
        mine = (await acme.post("/v1/tasks", json={"pool": "idle", "key": "a"})).json()["id"]
        theirs = (await globex.post("/v1/tasks", json={"pool": "idle", "key": "g"})).json()["id"]
        for response in (await acme.get(f"/v1/tasks/{theirs}"), await acme.get("/v1/tasks/by-key/g"),
                         await acme.get(f"/v1/tasks/{theirs}/result", params={"timeout_s": 0}),
                         await acme.delete(f"/v1/tasks/{theirs}")):
            assert response.status_code == 404 and response.json()["code"] == "not_found"
        assert (await globex.get(f"/v1/tasks/{theirs}")).json()["status"] == "ready"   # not cancelled
        assert [t["id"] for t in (await acme.get("/v1/tasks")).json()["tasks"]] == [mine]
        refused = await acme.get("/v1/tasks", params={"tenant": "globex"})
        assert refused.status_code == 403
        # The event stream carries only its own tenant's events.
        async with acme.stream("GET", "/v1/events", params={"snapshot_s": 0}) as stream:
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("event: hello")
            await globex.delete(f"/v1/tasks/{theirs}")
            await acme.delete(f"/v1/tasks/{mine}")
            statuses = []
            async for line in lines:
                if line.startswith("data: [") :
                    statuses += json.loads(line[len("data: "):])
                    if any(e["status"] == "cancelled" for e in statuses):
                        break
            assert {e["id"] for e in statuses} == {mine}
