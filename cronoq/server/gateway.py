"""The HTTP/JSON gateway: the Tasks service (without Watch) and the read-only
Admin calls as JSON routes, /metrics, the probes, and the OpenAPI document.

A thin transport over the service layer, like the gRPC services: each route
authenticates the caller (bearer token, or a client certificate's DNS
names), validates the query and the JSON body with the definitions of
``schema.py`` (the same ones ``openapi.py`` documents), maps them onto the
cronoq.v1 request message, and calls the ``Service`` method the gRPC API
calls, which holds the one admission path and the one authorization check.
Its ``ServiceError`` becomes ``{"error": ..., "code": ...}`` with the status
of its code (docs/server.md, Status codes). ``ROUTES`` is the table of
routes; docs/server.md documents it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from urllib.parse import parse_qsl, unquote_to_bytes

from .._proto import cronoq_pb2 as pb
from .._proto.json_view import OVERLAP_NAMES, dependents_json, explanation_json, info_json, result_json, snapshot_json
from .._version import __version__
from .auth import Authenticator, Principal
from .bodies import EXACT, Body, Payloads, task_message
from .counters import ServerCounters
from .errors import Code, ServiceError
from .grpc_web import Admitted as GrpcWebCall
from .grpc_web import GrpcWeb
from .origins import cross_site
from .history import history_json
from .http import Request, Response, loopback_host, reason_code
from .routes import PATH_PARAMS, ROUTES, Route
from .schema import Id, Text, invalid
from .convert import status_enum
from .service import Service
from .shards import UNAVAILABLE_METADATA, reply_notes

__all__ = ["Gateway", "Route", "ROUTES", "PATH_PARAMS"]

log = logging.getLogger("cronoq.server")


class HttpError(Exception):
    """A request refused by the gateway itself (not by the service layer)."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


@dataclass
class Call:
    """One request, validated: the caller, the path parameters, the query, the body."""

    request: Request
    caller: Principal | None
    params: dict[str, Any]
    query: dict[str, Any]
    body: dict[str, Any] | None
    payloads: Payloads = EXACT   # how the body's JSON payloads are encoded for the worker


Handler = Callable[["Gateway", Call], Awaitable[Response]]


# ---------------------------------------------------------------- JSON in, JSON out


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ASCII_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> bytes:
    try:
        return _ENCODER.encode(value).encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate (from a worker's JSON output): escape it
        return _ASCII_ENCODER.encode(value).encode("ascii")


# ---------------------------------------------------------------- the gateway


METRICS_LISTENER = Principal("metrics", name="the metrics listener (server.metrics_addr)")
_KEY = Text(empty=False)
_ID = Id()
_TASK_ROUTES = "/v1/tasks/"
_RECURRING_ROUTES = "/v1/recurring/"


def _decode_segment(segment: str, what: str) -> str:
    try:
        return unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, f"{what}: percent-encoded bytes are not UTF-8") from None


class Gateway:
    """The App of an HttpListener: the routes of ``ROUTES`` (all of them on
    server.http_addr; with ``metrics_listener``, those marked for
    server.metrics_addr, without credentials)."""

    def __init__(self, service: Service, auth: Authenticator, *, check_host: bool,
                 metrics_listener: bool = False, counters: ServerCounters | None = None) -> None:
        self.service = service
        self.auth = auth
        self.counters = counters if counters is not None else auth.limiter.counters
        self.check_host = check_host
        self.metrics_listener = metrics_listener
        limits = service.limits
        self.max_body = limits.max_http_body_bytes if not metrics_listener else 0
        self.short_limit = limits.request_timeout_s
        self.long_limit = limits.request_timeout_s + limits.max_wait_s
        self.routes: dict[str, dict[str, Route]] = {}
        for route in ROUTES:
            if metrics_listener and not route.metrics_listener:
                continue
            self.routes.setdefault(route.path, {})[route.method] = route
        self._openapi: bytes | None = None
        self._bodies: dict[str, Body] = {}   # route body's object name -> its reader
        self._hosts: dict[str, bool] = {}   # Host header -> whether it names loopback
        web = service.config.server.grpc_web
        # gRPC-Web (grpc_web.py): on server.http_addr only, with [server.grpc_web].
        self.grpc_web = (GrpcWeb(service, auth, web, max_body=self.max_body)
                         if web is not None and not metrics_listener else None)

    # -- what the listener asks

    def time_limit(self, request: Request) -> float:
        path = request.path
        if self.grpc_web is not None and isinstance(request.admitted, GrpcWebCall):
            return self.long_limit + 1.0   # (its own deadline answers first, with a gRPC status)
        if path == "/v1/tasks" or (path.endswith("/result") and path.startswith(_TASK_ROUTES)):
            return self.long_limit
        return self.short_limit

    def closing(self) -> bool:
        """A server that does not serve closes each connection after its answer,
        so a client behind a load balancer reaches another replica."""
        return self.service.state != "leader"

    def error(self, status: int, message: str, *, close: bool = False,
              headers: tuple[tuple[str, str], ...] = ()) -> Response:
        if status == 401:
            headers += (("www-authenticate", "Bearer"),)
        elif status == 503:
            headers += (("retry-after", "1"),)
        return Response(status, dumps({"error": message, "code": reason_code(status)}), headers=headers,
                        close=close)

    def admit(self, request: Request) -> Response | None:
        """Judge a request by its head (the listener calls this before it
        reads the body): the Host rule, cross-site requests, the route and
        its method, and the caller's credentials. A refusal, or None (what
        was found is kept on the request for ``__call__``)."""
        if self.grpc_web is not None and self.grpc_web.serves(request.path):
            # Its own rules and answers (gRPC statuses, CORS), the same Host rule.
            return self.grpc_web.admit(request, host_ok=not self.check_host
                                       or self._loopback(request.headers.get("host", "")))
        try:
            request.admitted = self._admit(request)
        except ServiceError as exc:
            return self._service_error(exc)
        except HttpError as exc:
            return self.error(exc.status, exc.message, headers=exc.headers)
        return None

    def _admit(self, request: Request) -> tuple[Route, dict[str, Any], Principal | None] | None:
        headers = request.headers
        if self.check_host and not self._loopback(headers.get("host", "")):
            raise HttpError(403, "forbidden: authentication is off, so only loopback host names are served "
                                 "(localhost, *.localhost, 127.x.x.x, [::1])")
        if request.method not in _SAFE_METHODS:
            reason = cross_site(headers)
            if reason is not None:
                raise HttpError(403, f"forbidden: a {request.method} from another site ({reason}); state-changing "
                                     f"requests are served only from this server's own origin or from "
                                     f"clients that are not browsers")
        if request.path == "/ui" or request.path.startswith("/ui/"):
            self._ui_allowed(request)
            return None
        route, params = self._match(request)
        caller = None
        if route.role is not None:
            caller = (METRICS_LISTENER if self.metrics_listener else
                      self.auth.authenticate(headers.get("authorization"), request.cert_names, peer=request.peer))
            if not route.also:   # (a route serving several roles says which it lacks itself)
                caller.require(route.role)   # (the service checks again; this spares reading the body)
        return route, params, caller

    def _loopback(self, host: str) -> bool:
        known = self._hosts.get(host)
        if known is None:
            known = loopback_host(host)
            if len(self._hosts) < 256:   # (a handful of names in practice)
                self._hosts[host] = known
        return known

    def _service_error(self, exc: ServiceError) -> Response:
        headers: tuple[tuple[str, str], ...] = ((("cronoq-error", exc.kind),) if exc.kind else ()) + exc.metadata
        if exc.retry_after_s is not None:
            headers += (("retry-after", str(max(1, math.ceil(exc.retry_after_s)))),)
        return self.error(exc.code.http_status, exc.message, headers=headers)

    async def __call__(self, request: Request) -> Response:
        try:
            if request.admitted is None:   # (a listener that does not call admit first)
                refusal = self.admit(request)
                if refusal is not None:
                    return refusal
            admitted = request.admitted
            if isinstance(admitted, GrpcWebCall):
                assert self.grpc_web is not None
                return await self.grpc_web.answer(request, admitted)
            if admitted is None:
                return self._ui(request)
            route, params, caller = admitted
            query = self._query(route, request.query) if request.query or route.query else {}
            body, payloads = self._body(route, request)
            handler: Handler = getattr(Gateway, route.handler)
            return await handler(self, Call(request, caller, params, query, body, payloads))
        except ServiceError as exc:
            return self._service_error(exc)
        except HttpError as exc:
            return self.error(exc.status, exc.message, headers=exc.headers)

    # -- the dashboard's static files

    def _ui_allowed(self, request: Request) -> None:
        """The web dashboard (docs/dashboard.md): static files without data,
        so they need no credentials; the page sends the token it is given to
        the API routes. Off with server.ui = false."""
        if self.metrics_listener or not self.service.config.server.ui:
            raise HttpError(404, f"no route {request.path[:200]}" + ("" if self.metrics_listener else
                                                                      " (the dashboard is off: server.ui = false)"))
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, f"{request.method} is not allowed on the dashboard's files; allowed: GET, HEAD",
                            (("allow", "GET, HEAD"),))

    def _ui(self, request: Request) -> Response:
        if request.path == "/ui":
            return Response(308, b"", "text/plain; charset=utf-8", headers=(("location", "/ui/"),))
        name = request.path[len("/ui/"):] or "index.html"
        found = UI_FILES.get(name)
        if found is None:
            raise HttpError(404, f"no dashboard file {name[:100]!r}; the files are {', '.join(sorted(UI_FILES))}")
        data, media = found
        return Response(200, data, media, headers=_UI_HEADERS)

    # -- matching and validating

    def _match(self, request: Request) -> tuple[Route, dict[str, Any]]:
        path = request.path
        routes = self.routes.get(path)
        params: dict[str, Any] = {}
        if routes is None:
            if self.metrics_listener:
                raise HttpError(404, f"no route {path[:200]}; the routes are listed at /v1/openapi.json")
            if path.startswith(_RECURRING_ROUTES) and "/" not in path[len(_RECURRING_ROUTES):] \
                    and len(path) > len(_RECURRING_ROUTES):
                template, params = "/v1/recurring/{name}", {"name": path[len(_RECURRING_ROUTES):]}
            elif path.startswith(_TASK_ROUTES):
                template, params = self._task_path(path[len(_TASK_ROUTES):])
            else:
                raise HttpError(404, f"no route {path[:200]}; the routes are listed at /v1/openapi.json")
            routes = self.routes[template]
        route = routes.get(request.method)
        if route is None:
            allowed = ", ".join(sorted(routes))
            raise HttpError(405, f"{request.method} is not allowed on {route_path(routes)}; allowed: {allowed}",
                            (("allow", allowed),))
        if "id" in params:
            text = params["id"]
            if not (text.isdigit() and text.isascii()):
                raise HttpError(400, f"{text[:60]!r} is not a task id (decimal digits); look a task up by key "
                                     f"at /v1/tasks/by-key/{{key}}")
            params["id"] = _ID.parse(text, "id")
        elif "key" in params:
            params["key"] = _KEY.parse(_decode_segment(params["key"], "key"), "key")
        elif "name" in params:
            params["name"] = _KEY.parse(_decode_segment(params["name"], "name"), "name")
        return route, params

    @staticmethod
    def _task_path(rest: str) -> tuple[str, dict[str, Any]]:
        parts = rest.split("/")
        if parts[0] == "by-key":
            if len(parts) == 2 and parts[1]:
                return "/v1/tasks/by-key/{key}", {"key": parts[1]}
            if len(parts) == 3 and parts[1] and parts[2] in _TASK_SUBPATHS:
                return "/v1/tasks/by-key/{key}/" + parts[2], {"key": parts[1]}
            raise HttpError(404, "no route; a key is one path segment: percent-encode / in keys as %2F "
                                 "(/v1/tasks/by-key/report%2F42)")
        if len(parts) == 1 and parts[0].endswith(":resubmit") and len(parts[0]) > len(":resubmit"):
            return "/v1/tasks/{id}:resubmit", {"id": parts[0][:-len(":resubmit")]}
        if len(parts) == 1 and parts[0].endswith(":explain") and len(parts[0]) > len(":explain"):
            return "/v1/tasks/{id}:explain", {"id": parts[0][:-len(":explain")]}
        if len(parts) == 1 and parts[0]:
            return "/v1/tasks/{id}", {"id": parts[0]}
        if len(parts) == 2 and parts[0] and parts[1] in _TASK_SUBPATHS:
            return "/v1/tasks/{id}/" + parts[1], {"id": parts[0]}
        raise HttpError(404, f"no route /v1/tasks/{rest[:200]}; the routes are listed at /v1/openapi.json")

    @staticmethod
    def _query(route: Route, text: str) -> dict[str, Any]:
        try:
            pairs = parse_qsl(text, keep_blank_values=True, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise HttpError(400, "the query string is not valid (percent-encoded UTF-8)") from None
        given: dict[str, list[str]] = {}
        for name, value in pairs:
            given.setdefault(name, []).append(value)
        fields = dict(route.query)
        out: dict[str, Any] = {}
        for name, values in given.items():
            field = fields.get(name)
            if field is None:
                known = ", ".join(fields) or "none"
                raise invalid(name, f"unknown query parameter (this route takes: {known})")
            if "\x00" in "".join(values):
                raise invalid(name, "must not contain NUL characters")
            out[name] = field.query(values, name)
        return out

    def _body(self, route: Route, request: Request) -> tuple[dict[str, Any] | None, Payloads]:
        schema = route.body
        if schema is None:
            if request.body:
                raise HttpError(400, f"{route.method} {route.path} takes no request body")
            return None, EXACT
        content_type = request.headers.get("content-type", "")
        media, _, params = content_type.partition(";")
        if media.strip().lower() != "application/json":
            raise HttpError(415, "request bodies must be JSON: send content-type: application/json"
                                 + (f" (got {content_type[:80]!r})" if content_type else ""))
        charset = params.strip().lower()
        if charset and charset.replace(" ", "") not in ("charset=utf-8", 'charset="utf-8"'):
            raise HttpError(415, "request bodies must be UTF-8 JSON (charset=utf-8)")
        body = self._bodies.get(schema.name)
        if body is None:
            body = self._bodies[schema.name] = Body(schema)
        return body.decode(request.body)

    # -- responses

    @staticmethod
    def json(value: Any) -> Response:
        return Response(200, dumps(value))

    # -- the routes' handlers

    def _notes(self) -> list[tuple[str, str]] | None:
        """Where a sharded service notes the shards a lookup by key could not ask."""
        if not self.service.sharded:
            return None
        notes: list[tuple[str, str]] = []
        reply_notes.set(notes)
        return notes

    @staticmethod
    def _task_ref(params: dict[str, Any]) -> pb.TaskRef:
        return pb.TaskRef(id=params["id"]) if "id" in params else pb.TaskRef(key=params["key"])

    async def submit(self, call: Call) -> Response:
        body = call.body
        assert body is not None and call.caller is not None
        request = pb.SubmitRequest(task=task_message(body, call.payloads), wait=body.get("wait", False))
        if "wait_timeout_s" in body:
            request.wait_timeout_s = body["wait_timeout_s"]
        response = await self.service.submit(call.caller, request)
        out: dict[str, Any] = {"id": str(response.id), "duplicate": response.duplicate}
        if response.HasField("result"):
            out["result"] = result_json(response.result)
        return self.json(out)

    async def submit_batch(self, call: Call) -> Response:
        assert call.body is not None and call.caller is not None
        tasks = call.body["tasks"]
        limit = self.service.limits.max_tasks_per_batch
        if len(tasks) > limit:   # before converting them all
            raise invalid("tasks", f"a batch holds at most {limit} tasks (limits), got {len(tasks)}")
        payloads = call.payloads
        request = pb.SubmitBatchRequest(tasks=[task_message(task, payloads) for task in tasks])
        response = await self.service.submit_batch(call.caller, request)
        return self.json({"tasks": [{"id": str(t.id), "duplicate": t.duplicate} for t in response.tasks]})

    async def get(self, call: Call) -> Response:
        assert call.caller is not None
        notes = self._notes()
        info = await self.service.get(call.caller, pb.GetRequest(task=self._task_ref(call.params)))
        return self.json(_missing(info_json(info), _noted(notes)))

    async def explain(self, call: Call) -> Response:
        assert call.caller is not None
        explanation = await self.service.explain(call.caller, pb.ExplainRequest(task=self._task_ref(call.params)))
        return self.json(explanation_json(explanation))

    async def result(self, call: Call) -> Response:
        assert call.caller is not None
        request = pb.WaitRequest(task=self._task_ref(call.params))
        if "timeout_s" in call.query:
            request.timeout_s = call.query["timeout_s"]
        notes = self._notes()
        result = await self.service.wait(call.caller, request)
        return self.json(_missing(result_json(result, call.query.get("max_bytes")), _noted(notes)))

    async def dependents(self, call: Call) -> Response:
        assert call.caller is not None
        query = call.query
        request = pb.DependentsRequest(task=self._task_ref(call.params), depth=query.get("depth", 0),
                                       limit=query.get("limit", 0))
        notes = self._notes()
        response = await self.service.dependents(call.caller, request)
        out = dependents_json(response)
        for name in _noted(notes):
            if name not in response.unavailable_shards:
                out.setdefault("unavailable_shards", []).append(name)
        return self.json(out)

    async def cancel(self, call: Call) -> Response:
        assert call.caller is not None
        response = await self.service.cancel(call.caller, pb.CancelRequest(task=self._task_ref(call.params)))
        return self.json({"cancelled": response.cancelled})

    async def list_tasks(self, call: Call) -> Response:
        assert call.caller is not None
        query = call.query
        newest = query.get("order", "oldest") == "newest"
        if "before" in query and not newest:
            raise invalid("before", "pages newest-first listings: give it with order=newest (oldest first "
                                    "pages with after)")
        request = pb.ListTasksRequest(pools=query.get("pool", ()),
                                      statuses=[status_enum(s) for s in query.get("status", ())],
                                      after=query.get("after", 0), limit=query.get("limit", 0),
                                      query=query.get("q", "").strip(), newest_first=newest,
                                      before=query.get("before", 0))
        response = await self.service.list_tasks(call.caller, request, priority=query.get("priority"),
                                                 tenant=query.get("tenant"))
        out: dict[str, Any] = {"tasks": [info_json(info) for info in response.tasks]}
        if response.next_after:
            out["next_after"] = str(response.next_after)
        if response.next_before:
            out["next_before"] = str(response.next_before)
        return self.json(_missing(out, response.unavailable_shards))

    async def cancel_many(self, call: Call) -> Response:
        """Cancel each task named; a task's error is its result, not the request's."""
        assert call.body is not None and call.caller is not None
        results: list[dict[str, Any]] = []
        refs: list[tuple[str, Any, pb.TaskRef]] = [("id", i, pb.TaskRef(id=i)) for i in call.body.get("ids", ())]
        refs += [("key", k, pb.TaskRef(key=k)) for k in call.body.get("keys", ())]
        for name, value, ref in refs:
            item: dict[str, Any] = {name: str(value) if name == "id" else value}
            try:
                response = await self.service.cancel(call.caller, pb.CancelRequest(task=ref))
            except ServiceError as exc:
                if exc.code == Code.UNAVAILABLE:
                    raise   # the server is not serving: nothing will be
                item.update(cancelled=False, error=exc.message)
            else:
                item.update(cancelled=response.cancelled, error=None)
            results.append(item)
        return self.json({"results": results})

    async def resubmit_many(self, call: Call) -> Response:
        """Submit each dead-lettered task named again; a task's error is its result."""
        assert call.body is not None and call.caller is not None
        results: list[dict[str, Any]] = []
        for task_id in call.body["ids"]:
            item: dict[str, Any] = {"id": str(task_id)}
            try:
                response = await self.service.resubmit(call.caller, task_id)
            except ServiceError as exc:
                if exc.code == Code.UNAVAILABLE:
                    raise
                item["error"] = exc.message
            else:
                item.update(new_id=str(response.id), error=None)
            results.append(item)
        return self.json({"results": results})

    async def workers(self, call: Call) -> Response:
        assert call.caller is not None
        response = await self.service.list_workers(call.caller, pb.ListWorkersRequest(pools=call.query.get("pool", ())))
        return self.json(_missing({"workers": [
            {"id": str(w.id), "name": w.name, "pool": w.pool, "labels": dict(w.labels), "slots": w.slots,
             "busy": w.busy, "connected_unix_ns": str(w.connected_unix_ns),
             "health": "suspect" if w.health == pb.WORKER_HEALTH_SUSPECT else "healthy",
             "lease_expiries": w.lease_expiries, "last_seen_unix_ns": str(w.last_seen_unix_ns)}
            for w in response.workers]}, response.unavailable_shards))

    async def timeline(self, call: Call) -> Response:
        assert call.caller is not None
        query = call.query
        answer = await self.service.timeline(call.caller, query.get("pool", ()), query.get("range_s", 300.0),
                                             query.get("ahead_s", 300.0))
        return self.json(answer)

    async def recurring(self, call: Call) -> Response:
        assert call.caller is not None
        response = await self.service.list_recurring(call.caller, pb.ListRecurringRequest())
        schedules = []
        for s in response.schedules:
            item: dict[str, Any] = {"name": s.name, "cron": s.cron}
            if s.tz:
                item["tz"] = s.tz
            item.update(pool=s.pool, kind=s.kind, overlap=OVERLAP_NAMES[s.overlap])
            if s.HasField("next_unix_ns"):
                item["next_unix_ns"] = str(s.next_unix_ns)
            if s.HasField("last_task_id"):
                item["last_task_id"] = str(s.last_task_id)
            schedules.append(item)
        return self.json(_missing({"schedules": schedules}, response.unavailable_shards))

    async def snapshot(self, call: Call) -> Response:
        assert call.caller is not None
        return self.json(snapshot_json(await self.service.snapshot(call.caller, pb.SnapshotRequest())))

    async def history(self, call: Call) -> Response:
        assert call.caller is not None
        query = call.query
        request = pb.HistoryRequest(pools=query.get("pool", ()), range_s=query.get("range_s", 0.0),
                                    points=query.get("points", 0))
        return self.json(history_json(await self.service.history_of(call.caller, request)))

    async def environments(self, call: Call) -> Response:
        """This server's identity and the catalog ([environments]): no
        credential is in it, and a standby answers too (it is configuration)."""
        caller = call.caller
        assert caller is not None
        if caller.role not in ("client", "metrics", "admin"):
            raise ServiceError(Code.PERMISSION_DENIED, f"the environments need the client or the metrics role; the "
                                                       f"credential has the {caller.role} role")
        server = self.service.config.server
        return self.json({"environment": server.environment or "", "region": server.region or "",
                          "environments": [e.as_json(server.environment)
                                           for e in self.service.config.environments]})

    async def resubmit(self, call: Call) -> Response:
        assert call.caller is not None
        response = await self.service.resubmit(call.caller, call.params["id"])
        return self.json({"id": str(response.id), "duplicate": response.duplicate})

    async def remove_recurring(self, call: Call) -> Response:
        assert call.caller is not None
        response = await self.service.remove_recurring(call.caller, pb.RemoveRecurringRequest(name=call.params["name"]))
        return self.json({"removed": response.removed})

    async def events(self, call: Call) -> Response:
        """Server-Sent Events: status events as they happen (batched), the
        snapshot every ``snapshot_s`` for callers with the metrics role, a
        comment line every ``_PING_S`` so proxies keep the connection, and a
        ``state`` event when this server stops serving (the stream then ends)."""
        caller = call.caller
        assert caller is not None
        roles = {"client", "metrics"} if caller.role == "admin" else {caller.role}
        if not roles & {"client", "metrics"}:
            raise ServiceError(Code.PERMISSION_DENIED, f"the event stream needs the client role (status events) or "
                                                       f"the metrics role (snapshots); the credential has the "
                                                       f"{caller.role} role")
        every = call.query.get("snapshot_s", 1.0)
        snapshots = "metrics" in roles and every > 0
        sched, feed = self.service.open_feed(caller, call.query.get("pool", ()), events="client" in roles,
                                             recent=int(call.query.get("recent", 0)))
        return Response(200, b"", "text/event-stream; charset=utf-8", headers=(("x-accel-buffering", "no"),),
                        stream=self._push(caller, sched, feed, max(every, _MIN_SNAPSHOT_S) if snapshots else 0.0))

    async def _push(self, caller: Principal, sched: Any, feed: Any, every: float) -> AsyncIterator[bytes]:
        service = self.service
        loop = asyncio.get_running_loop()
        try:
            hello = {"state": service.state, "role": caller.role, "snapshot_s": every,
                     "status_events": caller.role in ("client", "admin"),
                     "pools": caller.visible(service.every_pool), "version": __version__,
                     "environment": service.config.server.environment or "",
                     "region": service.config.server.region or ""}
            yield _sse("hello", hello) + b"retry: 1000\n\n"
            next_snapshot = loop.time()
            next_ping = loop.time() + _PING_S
            while True:
                if not service.serves(sched) or feed.ended:
                    yield _sse("state", {"state": service.state if service.state != "leader" else "standby"})
                    return
                now = loop.time()
                if not feed.events:
                    wake = min(next_ping, next_snapshot if every else next_ping, now + _STATE_CHECK_S)
                    try:
                        await asyncio.wait_for(feed.wake.wait(), max(0.0, wake - now))
                    except asyncio.TimeoutError:
                        pass
                    else:
                        await asyncio.sleep(_COALESCE_S)   # let a burst gather into one message
                events, lagged = feed.take()
                out = []
                if feed.unavailable_changed:
                    feed.unavailable_changed = False
                    out.append(_sse("shards", {"unavailable_shards": list(feed.unavailable)}))
                if lagged:
                    out.append(_sse("lagged", {"skipped": lagged}))
                if events:
                    out.append(_sse("status", [_event_json(e) for e in events]))
                now = loop.time()
                if every and now >= next_snapshot and service.serves(sched):
                    next_snapshot = now + every
                    try:
                        snap = await service.snapshot(caller, pb.SnapshotRequest())
                    except ServiceError:
                        continue   # stopped serving meanwhile: said at the top of the loop
                    out.append(_sse("snapshot", snapshot_json(snap)))
                if now >= next_ping:
                    next_ping = now + _PING_S
                    out.append(b": ping\n\n")
                if out:
                    yield b"".join(out)
        finally:
            service.close_feed(sched, feed)

    async def metrics(self, call: Call) -> Response:
        assert call.caller is not None
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        started = time.perf_counter()
        snap = await self.service.metrics(call.caller)
        took = time.perf_counter() - started
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(snap, took, self.counters, self.service.worker_health(call.caller)))
        return Response(200, generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

    async def openapi(self, call: Call) -> Response:
        if self._openapi is None:
            from .openapi import document
            self._openapi = dumps(document())
        return Response(200, self._openapi)

    async def healthz(self, call: Call) -> Response:
        return Response(200, b"ok\n", "text/plain; charset=utf-8")

    async def readyz(self, call: Call) -> Response:
        if self.service.state == "leader":
            return Response(200, b"ready\n", "text/plain; charset=utf-8")
        return Response(503, b"not the leader (standby or shutting down)\n", "text/plain; charset=utf-8",
                        headers=(("retry-after", "1"),))


_UI_MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
             ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# The page runs only its own script and talks only to its own origin; no framing, no referrer.
_UI_HEADERS = (
    ("content-security-policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    ("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer"), ("x-frame-options", "DENY"),
    ("cache-control", "no-cache"),
)


def _ui_files() -> dict[str, tuple[bytes, str]]:
    """Every file of cronoq/server/ui, read once at import: requests pick
    one of these by name and never build a path."""
    from importlib.resources import files
    found: dict[str, tuple[bytes, str]] = {}
    for entry in files("cronoq.server").joinpath("ui").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and not entry.name.startswith(".") and suffix in _UI_MEDIA:
            found[entry.name] = (entry.read_bytes(), _UI_MEDIA[suffix])
    return found


UI_FILES = _ui_files()


_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_TASK_SUBPATHS = frozenset(("result", "dependents"))   # /v1/tasks/{id}/<this> and /v1/tasks/by-key/{key}/<this>
_PING_S = 15.0           # a comment line this often keeps proxies from closing an idle stream
_STATE_CHECK_S = 0.25    # how soon a stream notices that its server stopped serving
_COALESCE_S = 0.02       # status events arriving this close together go out as one message
_MIN_SNAPSHOT_S = 0.2


def _missing(out: dict[str, Any], shards: Iterable[str]) -> dict[str, Any]:
    """``out`` naming the shards that could not be asked, if any (sharding)."""
    missing = list(shards)
    if missing:
        out["unavailable_shards"] = missing
    return out


def _noted(notes: list[tuple[str, str]] | None) -> list[str]:
    return [name for key, value in notes or () if key == UNAVAILABLE_METADATA for name in value.split(",")]


def _sse(event: str, data: Any) -> bytes:
    """One Server-Sent Events message (JSON never holds a newline as we write it)."""
    return b"event: %s\ndata: %s\n\n" % (event.encode("ascii"), dumps(data))


def _event_json(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(event.id), "pool": event.pool, "status": event.status, "attempt": event.attempt,
                           "at_unix_ns": str(int(round(event.at * 1e9)))}
    if event.key is not None:
        out["key"] = event.key
    if event.message:
        out["message"] = event.message
    if event.stage is not None:
        out["stage"] = event.stage
    if event.max_attempts is not None:
        out["max_attempts"] = event.max_attempts
    return out


def route_path(routes: dict[str, Route]) -> str:
    return next(iter(routes.values())).path


class _Scrape:
    """One scrape's metric families, from one snapshot (cronoq.telemetry's
    series), and the health of the remote workers."""

    def __init__(self, snap: Any, took: float, counters: ServerCounters,
                 workers: list[tuple[str, int, int, int]]) -> None:
        self.snap = snap
        self.took = took
        self.counters = counters
        self.workers = workers

    def collect(self) -> Iterator[Any]:
        from ..telemetry.prometheus import scrape_families, worker_families
        yield from scrape_families(self.snap, self.took)
        yield from self.counters.families()
        yield from worker_families(self.workers)
