"""Finding and acting on tasks without a browser: GET /v1/tasks with q,
order=newest and before (and gRPC ListTasks' query, newest_first, before),
POST /v1/tasks:cancel and POST /v1/tasks:resubmit, and the newest-first
merge of sharded listings."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
import pytest_asyncio

import cronoq
import cronoq.server
from cronoq._proto import cronoq_pb2 as pb
from cronoq.client import Worker
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER, bearer, stubs

pytestmark = pytest.mark.asyncio

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "idle"
"""


async def handle(lease):
    if (lease.json() or {}).get("fail"):
        raise cronoq.Retryable("failed as asked")
    return {}


def http(server, token: str | None = CLIENT) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", headers=headers, timeout=60)


@pytest_asyncio.fixture
async def server():
    async with cronoq.server.serve(CONFIG) as running:
        worker = Worker(running.target, "default", handle, slots=2, token=WORKER)
        task = asyncio.create_task(worker.run())
        yield running
        worker.stop()
        await asyncio.wait_for(task, 30)


async def submit(api: httpx.AsyncClient, **task) -> str:
    response = await api.post("/v1/tasks", json={"pool": "idle", "payload": {}, **task})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def ids_of(answer: dict) -> list[str]:
    return [task["id"] for task in answer["tasks"]]


# ---------------------------------------------------------------- search


async def test_q_finds_by_id_exactly_and_by_key_kind_tenant_message_or_tag_text(server):
    async with http(server) as api:
        report = await submit(api, key="Report/March", kind="render")
        invoice = await submit(api, key="invoice-7", kind="billing", tenant="acme")
        tagged = await submit(api, kind="misc", tags={"customer": "Globex Corp"})
        failed = await submit(api, pool="default", payload={"fail": True}, retry={"max_attempts": 1}, wait=True)

        async def found(q: str, **params) -> list[str]:
            response = await api.get("/v1/tasks", params={"q": q, **params})
            assert response.status_code == 200, response.text
            return ids_of(response.json())

        assert await found(report) == [report]                  # all digits: that id only
        assert await found(str(int(report) + 1000)) == []        # no such id
        assert await found("report/mar") == [report]             # key, any case
        assert await found("BILL") == [invoice]                  # kind
        assert await found("acm") == [invoice]                   # tenant
        assert await found("globex") == [tagged]                 # a tag value
        assert await found("as asked") == [failed]               # the failure message
        # The other filters still apply.
        assert await found("invoice", status="succeeded") == []
        assert await found(invoice, pool="default") == []
        assert await found(invoice, pool="idle") == [invoice]
        assert await found("render", order="newest") == [report]


async def test_a_search_scans_at_most_max_list_tasks_per_answer_and_the_cursor_leads_on(server):
    async with http(server) as api:
        first = await submit(api, key="needle-1")
        for n in range(6):
            await submit(api, key=f"hay-{n}")
        last = await submit(api, key="needle-2")
        page = (await api.get("/v1/tasks", params={"q": "needle", "limit": 1})).json()
        assert ids_of(page) == [first] and page["next_after"] == first
        page = (await api.get("/v1/tasks", params={"q": "needle", "limit": 1, "after": page["next_after"]})).json()
        assert ids_of(page) == [last]
        page = (await api.get("/v1/tasks", params={"q": "needle", "limit": 1, "order": "newest"})).json()
        assert ids_of(page) == [last] and page["next_before"] == last
        page = (await api.get("/v1/tasks", params={"q": "needle", "limit": 1, "order": "newest",
                                                   "before": page["next_before"]})).json()
        assert ids_of(page) == [first]


# ---------------------------------------------------------------- newest first


async def test_newest_first_lists_descending_ids_and_pages_with_before(server):
    async with http(server) as api:
        made = [await submit(api, key=f"n{n}") for n in range(5)]
        done = await submit(api, pool="default", wait=True)   # finished tasks come in id order too
        newest = [done, *reversed(made)]
        page = (await api.get("/v1/tasks", params={"order": "newest", "limit": 2})).json()
        assert ids_of(page) == newest[:2] and page["next_before"] == newest[1] and "next_after" not in page
        seen = ids_of(page)
        while "next_before" in page:
            page = (await api.get("/v1/tasks", params={"order": "newest", "limit": 2,
                                                       "before": page["next_before"]})).json()
            seen += ids_of(page)
        assert seen == newest
        oldest = (await api.get("/v1/tasks")).json()
        assert ids_of(oldest) == sorted(newest, key=int)
        by_status = (await api.get("/v1/tasks", params={"order": "newest", "status": "ready"})).json()
        assert ids_of(by_status) == list(reversed(made))


async def test_the_listing_parameters_are_validated_by_name(server):
    async with http(server) as api:
        for params, field in (({"order": "sideways"}, "order"), ({"before": "x", "order": "newest"}, "before"),
                              ({"before": "5"}, "before"), ({"q": "a", "q2": "b"}, "q2")):
            response = await api.get("/v1/tasks", params=params)
            assert response.status_code == 400, params
            assert response.json()["error"].startswith(field), response.json()


async def test_grpc_list_tasks_takes_query_newest_first_and_before(server):
    channel, tasks, _ = stubs(server.target)
    try:
        async with http(server) as api:
            a = int(await submit(api, kind="grpc-search"))
            b = int(await submit(api, kind="grpc-search"))
            await submit(api, kind="other")
        meta = bearer(CLIENT)
        listing = await tasks.ListTasks(pb.ListTasksRequest(query="GRPC-search", newest_first=True, limit=1),
                                        metadata=meta)
        assert [t.id for t in listing.tasks] == [b] and listing.next_before == b and listing.next_after == 0
        listing = await tasks.ListTasks(pb.ListTasksRequest(query="grpc-search", newest_first=True, limit=1,
                                                            before=b), metadata=meta)
        assert [t.id for t in listing.tasks] == [a]
        listing = await tasks.ListTasks(pb.ListTasksRequest(query=str(a)), metadata=meta)
        assert [t.id for t in listing.tasks] == [a]
    finally:
        await channel.close()


async def test_the_python_client_lists_with_query_and_newest_first(server):
    async with http(server) as api:
        a = int(await submit(api, key="client-a"))
        b = int(await submit(api, key="client-b"))
    async with cronoq.client.Client(server.target, token=CLIENT) as client:
        page = await client.list(query="client-", newest_first=True)
        assert [t.id for t in page.tasks] == [b, a]
        page = await client.list(query="client-", newest_first=True, before=b)
        assert [t.id for t in page.tasks] == [a]


# ---------------------------------------------------------------- bulk actions


async def test_bulk_cancel_answers_per_task_by_id_and_by_key(server):
    async with http(server) as api:
        pending = await submit(api, key="bulk-1")
        by_key = await submit(api, key="bulk-2")
        done = await submit(api, pool="default", wait=True)
        response = await api.post("/v1/tasks:cancel", json={"ids": [pending, done, "99999"],
                                                            "keys": ["bulk-2", "no-such-key"]})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert results[0] == {"id": pending, "cancelled": True, "error": None}
        assert results[1] == {"id": done, "cancelled": False, "error": None}
        assert results[2]["id"] == "99999" and results[2]["cancelled"] is False and "99999" in results[2]["error"]
        assert results[3] == {"key": "bulk-2", "cancelled": True, "error": None}
        assert results[4]["cancelled"] is False and "no-such-key" in results[4]["error"]
        for task_id in (pending, by_key):
            assert (await api.get(f"/v1/tasks/{task_id}")).json()["status"] == "cancelled"


async def test_bulk_resubmit_needs_admin_and_answers_new_ids_or_errors(server):
    async with http(server) as api, http(server, ADMIN) as admin:
        dead = (await api.post("/v1/tasks", json={"payload": {"fail": True}, "retry": {"max_attempts": 1},
                                                  "tags": {"batch": "7"}, "wait": True})).json()
        assert dead["result"]["status"] == "dead_lettered"
        alive = await submit(api)
        refused = await api.post("/v1/tasks:resubmit", json={"ids": [dead["id"]]})
        assert refused.status_code == 403 and "admin" in refused.json()["error"]
        response = await admin.post("/v1/tasks:resubmit", json={"ids": [dead["id"], alive]})
        assert response.status_code == 200, response.text
        first, second = response.json()["results"]
        assert first["id"] == dead["id"] and first["error"] is None and first["new_id"] != dead["id"]
        again = (await admin.get(f"/v1/tasks/{first['new_id']}")).json()
        assert again["tags"] == {"batch": "7", "resubmitted_from": dead["id"]}
        assert second["id"] == alive and "new_id" not in second and "only dead-lettered" in second["error"]


async def test_bulk_bodies_are_validated_by_field_and_roles_are_checked(server):
    async with http(server) as api, http(server, METRICS) as metrics, http(server, ADMIN) as admin:
        for body, field in (({}, "ids"), ({"ids": []}, "ids"), ({"ids": ["x"]}, "ids[0]"),
                            ({"keys": [""]}, "keys[0]"), ({"ids": [str(n) for n in range(1, 502)]}, "ids"),
                            ({"idz": ["1"]}, "idz")):
            response = await api.post("/v1/tasks:cancel", json=body)
            assert response.status_code == 400, body
            assert response.json()["error"].startswith(field), response.json()
        response = await admin.post("/v1/tasks:resubmit", json={"keys": ["a"]})
        assert response.status_code == 400 and response.json()["error"].startswith("keys")
        response = await metrics.post("/v1/tasks:cancel", json={"ids": ["1"]})
        assert response.status_code == 403
        anonymous = await http(server, None).__aenter__()
        try:
            assert (await anonymous.post("/v1/tasks:cancel", json={"ids": ["1"]})).status_code == 401
        finally:
            await anonymous.aclose()


async def test_openapi_documents_the_new_parameters_and_routes(server):
    async with http(server, None) as api:
        document = (await api.get("/v1/openapi.json")).json()
    names = {p["name"] for p in document["paths"]["/v1/tasks"]["get"]["parameters"]}
    assert {"q", "order", "before"} <= names
    assert "post" in document["paths"]["/v1/tasks:cancel"] and "post" in document["paths"]["/v1/tasks:resubmit"]
    schemas = document["components"]["schemas"]
    assert {"BulkCancelRequest", "BulkCancelResponse", "BulkResubmitRequest", "BulkResubmitResponse"} <= set(schemas)


# ---------------------------------------------------------------- shards


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard_config(directory, ports: dict[str, int]) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
{AUTH}
[store]
kind = "sqlite"
path = "{directory}/shard-{{shard}}.db"
full_sync = false

[[pools]]
name = "default"
[[pools]]
name = "gpu"

[[shards]]
name = "a"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:{ports['a']}"
[[shards]]
name = "b"
number = 2
pools = ["gpu"]
endpoint = "http://127.0.0.1:{ports['b']}"
"""


async def test_sharded_newest_first_listings_merge_every_shard_descending(servers, tmp_path):
    ports = {"a": free_port(), "b": free_port()}
    text = shard_config(tmp_path, ports)
    a = servers(text.replace("{port}", str(ports["a"])), args=("--shard", "a"), name="a")
    servers(text.replace("{port}", str(ports["b"])), args=("--shard", "b"), name="b")
    async with http(a) as api:
        made = []
        for n in range(3):
            made.append(await submit(api, pool="default", key=f"s-a{n}"))
            made.append(await submit(api, pool="gpu", key=f"s-b{n}"))
        descending = sorted(made, key=int, reverse=True)   # b's ids (shard 2) are the larger
        page = (await api.get("/v1/tasks", params={"order": "newest", "limit": 4})).json()
        assert ids_of(page) == descending[:4] and page["next_before"] == descending[3]
        page = (await api.get("/v1/tasks", params={"order": "newest", "limit": 4,
                                                   "before": page["next_before"]})).json()
        assert ids_of(page) == descending[4:] and "next_before" not in page
        found = (await api.get("/v1/tasks", params={"q": "s-b", "order": "newest"})).json()
        assert ids_of(found) == [i for i in descending if int(i) >> 56 == 2]
        by_id = (await api.get("/v1/tasks", params={"q": made[1]})).json()   # another shard's, by id
        assert ids_of(by_id) == [made[1]]
        cancelled = (await api.post("/v1/tasks:cancel", json={"ids": [made[0], made[1]]})).json()["results"]
        assert [r["cancelled"] for r in cancelled] == [True, True], cancelled
