"""The OpenAPI 3.1 document of the HTTP/JSON gateway, generated from its
route table (``routes.ROUTES``) and the field
definitions it validates requests with (``schema.py``): nothing here is
written twice. Served at /v1/openapi.json."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .._version import __version__
from .http import REASONS, reason_code
from .routes import PATH_PARAMS, ROUTES, Route
from .answers import ERROR
from .schema import CommaList, Field, Obj

__all__ = ["document"]

_INTRO = ("The HTTP/JSON API of cronoq-server: the Tasks service (without Watch), the read-only Admin calls, "
          "metrics and probes. Ids and *_unix_ns times are strings in responses and accepted as strings or "
          "numbers; durations (*_s) are finite seconds >= 0. Request bodies are JSON (content-type: "
          "application/json), at most limits.max_http_body_bytes; unknown fields are refused. Errors are "
          "{\"error\": ..., \"code\": ...}, code being the reason phrase in lower case with underscores. "
          "Only the leader serves: a standby or a stopping server answers 503. See docs/server.md.")


def _content(media: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {media: {"schema": schema}}


def document(routes: Iterable[Route] = ROUTES, path_params: Mapping[str, Field] = PATH_PARAMS) -> dict[str, Any]:
    """The document of ``routes``, whose paths hold the ``path_params``."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, dict[str, Any]] = {}

    def register(obj: Obj, out: bool) -> None:
        for each in obj.objects():
            definition = each.definition(out)
            name = each.component(out)
            if schemas.setdefault(name, definition) != definition:
                raise RuntimeError(f"two definitions of the component {name}")

    register(ERROR, True)
    for route in routes:
        operation: dict[str, Any] = {"operationId": route.operation, "summary": route.summary}
        description = route.description
        if route.role is not None:
            description = (description + " " if description else "") + \
                f"Needs the {route.role} role (or admin)."
            operation["security"] = [{"bearer": []}]
        else:
            operation["security"] = []
        if description:
            operation["description"] = description
        operation["x-cronoq-role"] = route.role
        parameters = []
        for name, field in path_params.items():
            if "{" + name + "}" in route.path:
                parameters.append({"name": name, "in": "path", "required": True,
                                   "description": field.description, "schema": field.schema(True)})
        for name, field in route.query:
            parameter: dict[str, Any] = {"name": name, "in": "query", "required": False,
                                         "description": field.description, "schema": field.schema(False)}
            if isinstance(field, CommaList):
                parameter.update(style="form", explode=False)
            parameters.append(parameter)
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            register(route.body, False)
            operation["requestBody"] = {"required": True,
                                        "content": _content("application/json", route.body.schema(False))}
        responses: dict[str, Any] = {}
        if route.response is not None:
            register(route.response, True)
            ok: dict[str, Any] = {"description": "OK", "content": _content(route.media, route.response.schema(True))}
        elif route.method == "HEAD":
            ok = {"description": "OK (no body)"}
        else:
            body = {"type": "object"} if route.media == "application/json" else {"type": "string"}
            ok = {"description": "OK", "content": _content(route.media, body)}
        responses["200"] = ok
        for status in sorted(route.statuses):
            answer: dict[str, Any] = {"description": f"{REASONS[status]} ({reason_code(status)})"}
            if route.path.startswith("/v1/") or route.role is not None:
                answer["content"] = _content("application/json", ERROR.schema(True))
            elif route.method != "HEAD":
                answer["content"] = _content(route.media, {"type": "string"})
            responses[str(status)] = answer
        operation["responses"] = responses
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "cronoq-server HTTP API", "version": __version__, "description": _INTRO},
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A token of [[auth.tokens]] (roles: client for /v1/tasks, metrics for /v1/workers, "
                               "/v1/recurring, /v1/snapshot and /metrics; admin for all). Not needed when "
                               "authentication is off."}},
        },
    }
