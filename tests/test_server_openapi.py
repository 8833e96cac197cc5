"""/v1/openapi.json against the live routes of a real server: the document
is valid (every schema JSON Schema 2020-12, every reference resolved), is
generated from the gateway's own tables, lists every route the server
serves and nothing else, and every live answer validates against the schema
the document gives for it. Every field of the documented task object is
accepted by the live server, and a field the document lacks is refused:
the document and the validation cannot disagree."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
import pytest_asyncio
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import cronoq
from cronoq.client import Worker
from cronoq.server import gateway
from cronoq.server.openapi import document
from cronoq.server.schema import SUBMIT
from httpkit import client, until
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER

pytestmark = pytest.mark.asyncio

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "idle"
[[resources]]
name = "gpu"
kind = "semaphore"
permits = 2
[[recurring]]
name = "nightly"
cron = "0 3 * * *"
tz = "Europe/Berlin"
pool = "idle"
"""

TOKENS = {"client": CLIENT, "metrics": METRICS, "admin": ADMIN, None: None}
BASE = "urn:cronoq-openapi"


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="openapi")


@pytest_asyncio.fixture
async def live(server):
    """The document as served, and a validator factory for its schemas."""
    async with client(server) as http:   # no credentials needed
        r = await http.get("/v1/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    registry = Registry().with_resource(BASE, Resource.from_contents(doc, default_specification=DRAFT202012))

    def validator(schema: dict) -> Draft202012Validator:
        if "$ref" in schema:
            schema = {"$ref": BASE + schema["$ref"]}
        return Draft202012Validator(schema, registry=registry)

    return doc, validator


async def echo(lease):
    if lease.json() == {"dead": True}:
        raise cronoq.Retryable("a dead letter for the resubmit route")
    return {"echo": lease.json()}


async def test_the_document_is_valid_and_generated_from_the_gateway_tables(live):
    doc, validator = live
    assert doc == document()                      # the served document is the generated one
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"]
    for name, schema in doc["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)
    refs = set(re.findall(r'"\$ref": "#/components/schemas/(\w+)"', __import__("json").dumps(doc)))
    assert refs <= set(doc["components"]["schemas"]) and refs
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert documented == {(route.method, route.path) for route in gateway.ROUTES}
    operations = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(operations) == len(set(operations))
    task = doc["components"]["schemas"]["Task"]
    assert set(task["properties"]) == set(SUBMIT.fields) - {"wait", "wait_timeout_s"}
    assert task["additionalProperties"] is False


async def test_every_live_answer_validates_against_the_document(server, live):
    doc, validator = live
    worker = Worker(server.target, "default", echo, token=WORKER, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with client(server, CLIENT) as http:
            done = (await http.post("/v1/tasks", json={"payload": {"n": 1}, "key": "oa/done", "wait": True})).json()
            waiting = (await http.post("/v1/tasks", json={"pool": "idle", "key": "oa-waiting"})).json()
            dead = (await http.post("/v1/tasks", json={"payload": {"dead": True}, "retry": {"max_attempts": 1},
                                                        "wait": True})).json()
            assert dead["result"]["status"] == "dead_lettered"
        params = {"id": done["id"], "key": "oa%2Fdone"}
        examples = {("GET", "/v1/tasks"): {"pool": "default,idle", "limit": "1"},
                    ("GET", "/v1/tasks/{id}/result"): {"timeout_s": "5"},
                    ("GET", "/v1/workers"): {"pool": "default"}}
        bodies = {"/v1/tasks": {"payload": [1, 2], "key": "oa-new", "wait": False},
                  "/v1/tasks:batch": {"tasks": [{"key": "oa-b1"}, {"key": "oa-b2", "after": ["oa-b1"]}]},
                  "/v1/tasks:cancel": {"ids": [done["id"], "999999"], "keys": ["oa-no-such-key"]},
                  "/v1/tasks:resubmit": {"ids": [dead["id"], done["id"]]}}
        async with client(server, METRICS) as metrics_http:
            await until(lambda: _workers(metrics_http), what="the worker connecting")
        checked = 0
        for path, item in doc["paths"].items():
            for method, operation in item.items():
                role = operation["x-cronoq-role"]
                values = params if method != "delete" else {"id": waiting["id"], "key": "oa-waiting",
                                                             "name": "oa-no-such-schedule"}
                if path.endswith(":resubmit"):
                    values = {"id": dead["id"]}
                url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
                async with client(server, TOKENS[role]) as http:
                    if "text/event-stream" in operation["responses"]["200"].get("content", {}):
                        # A stream never ends by itself: its head and first event are the answer.
                        async with http.stream("GET", url) as r:
                            assert r.status_code == 200, (method, path)
                            assert r.headers["content-type"].startswith("text/event-stream")
                            async for line in r.aiter_lines():
                                assert line == "event: hello", line
                                break
                    else:
                        r = await http.request(method.upper(), url, params=examples.get((method.upper(), path)),
                                               json=bodies.get(path) if method == "post" else None)
                    assert str(r.status_code) in operation["responses"], (method, path, r.status_code)
                    assert r.status_code == 200, (method, path)
                    content = operation["responses"]["200"].get("content", {})
                    if "text/event-stream" in content:
                        pass
                    elif "application/json" in content:
                        validator(content["application/json"]["schema"]).validate(r.json())
                    elif method != "head":
                        assert r.headers["content-type"].startswith(next(iter(content)))
                    if role is not None:   # without credentials: a documented 401 with the error body
                        # From an address of its own each time: the failures of a
                        # few dozen routes would exhaust one address's budget (429).
                        own_address = httpx.AsyncHTTPTransport(local_address=f"127.0.2.{checked + 1}")
                        async with client(server, transport=own_address) as anonymous:
                            refused = await anonymous.request(method.upper(), url,
                                                              json=bodies.get(path) if method == "post" else None)
                        assert refused.status_code == 401 and "401" in operation["responses"]
                        validator(operation["responses"]["401"]["content"]["application/json"]["schema"]
                                  ).validate(refused.json())
                checked += 1
        assert checked == len(gateway.ROUTES)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


async def _workers(http) -> bool:
    return bool((await http.get("/v1/workers")).json()["workers"])


async def test_errors_validate_and_undocumented_methods_and_paths_are_refused(server, live):
    doc, validator = live
    error = validator({"$ref": "#/components/schemas/Error"})
    async with client(server, ADMIN) as http:
        for path, item in doc["paths"].items():
            url = path.replace("{id}", "1").replace("{key}", "k").replace("{name}", "n")
            for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                if method.lower() in item:
                    continue
                r = await http.request(method, url)
                assert r.status_code == 405, (method, path)
                assert set(r.headers["allow"].split(", ")) == {m.upper() for m in item}
                error.validate(r.json())
        for url in ("/v1", "/v1/", "/v1/tasks/", "/v1/task", "/v1/tasks/1/results", "/v1/tasks/by-key",
                    "/v1/tasks/by-key/a/b", "/v2/snapshot", "/openapi.json", "/"):
            r = await http.get(url)
            assert r.status_code == 404, url
            error.validate(r.json())


# Every field of the documented task object, with a value the live server accepts.
EXAMPLES = {
    "payload": {"any": ["json"]}, "payload_b64": "AAE=", "payload_text": "text", "content_type": "text/csv",
    "pool": "idle", "kind": "report", "priority": "critical", "key": "oa-field-key", "tenant": "acme",
    "deadline_in_s": 60, "deadline_unix_ns": "4000000000000000000", "start_in_s": 3600,
    "start_unix_ns": 4_000_000_000_000_000_000, "tolerance_s": 5, "on_miss": "fail", "timeout_s": 10,
    "duration_hint_s": 0.5, "retry": {"max_attempts": 4, "initial_backoff_s": 0.1, "multiplier": 3,
                                      "max_backoff_s": 2, "jitter": False},
    "resources": {"gpu": 1}, "after": ["oa-dep", {"key": "oa-dep"}], "deps": [{"key": "oa-dep", "cond": "on_complete"}],
    "tags": {"team": "a"}, "labels": {"zone": "b"}, "stages": ["fetch", "render"], "wait": False, "wait_timeout_s": 1,
}


async def test_every_documented_field_is_accepted_and_others_refused(server, live):
    doc, validator = live
    schema = doc["components"]["schemas"]["SubmitRequest"]
    assert set(EXAMPLES) == set(schema["properties"]), "a field without an example here"
    request_schema = validator({"$ref": "#/components/schemas/SubmitRequest"})
    async with client(server, CLIENT) as http:
        await http.post("/v1/tasks", json={"pool": "idle", "key": "oa-dep"})
        for name, value in EXAMPLES.items():
            body = {"pool": "idle", name: value}
            request_schema.validate(body)
            r = await http.post("/v1/tasks", json=body)
            assert r.status_code == 200, (name, r.text)
        for name in ("priorty", "payload_json", "id", "task"):
            assert not request_schema.is_valid({name: 1})
            r = await http.post("/v1/tasks", json={name: 1})
            assert r.status_code == 400 and r.json()["error"].startswith(f"{name}: unknown field")
        for path, item in doc["paths"].items():   # documented query parameters only
            for method, operation in item.items():
                if method == "get" and path == "/v1/tasks":
                    names = {p["name"] for p in operation["parameters"]}
                    assert names == {"pool", "status", "after", "limit", "priority", "tenant", "q", "order", "before"}
                    r = await http.get(path, params={"offset": 1})
                    assert r.status_code == 400 and "unknown query parameter" in r.text
