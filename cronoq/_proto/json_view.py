"""cronoq.v1 messages as the HTTP API's JSON documents.

One definition for the HTTP gateway (which answers with them) and the
command line (whose ``-o json`` prints the same documents): ids and
nanosecond times are strings, enums are their lower-case names, and
payloads appear parsed when JSON, as text when text, and always as base64.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ..core.snapshot import POOL_FIELDS, TOTAL_FIELDS
from ..core.types import CLASSES
from . import cronoq_pb2 as pb


def _enum_names(enum: Any, prefix: str) -> dict[int, str]:
    return {value: name[len(prefix):].lower() for name, value in enum.items()}


STATUS_NAMES = _enum_names(pb.TaskStatus, "TASK_STATUS_")
PRIORITY_NAMES = {**_enum_names(pb.Priority, "PRIORITY_"), pb.PRIORITY_UNSPECIFIED: "normal"}
OVERLAP_NAMES = {**_enum_names(pb.Overlap, "OVERLAP_"), pb.OVERLAP_UNSPECIFIED: "skip"}
CONDITION_NAMES = _enum_names(pb.EdgeCond, "EDGE_COND_")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# Strict JSON: NaN and Infinity are not numbers of the API.
JSON_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _bytes_fields(out: dict[str, Any], data: bytes, content_type: str, name: str) -> None:
    """``name`` (parsed JSON) or ``name_text`` (UTF-8 text) when they apply, and ``name_b64``."""
    if is_json(content_type):
        try:
            out[name] = JSON_DECODER.decode(data.decode("utf-8"))
        except (ValueError, RecursionError):
            pass
    elif content_type.lower().startswith("text/"):
        try:
            out[name + "_text"] = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    out[name + "_b64"] = base64.b64encode(data).decode("ascii")


def is_text(content_type: str) -> bool:
    """JSON or text/*: content shown as text."""
    return is_json(content_type) or content_type.lower().startswith("text/")


def utf8_text(data: bytes, cut: bool) -> str | None:
    """``data`` as UTF-8 text, or None; when ``cut`` (the first bytes of
    something longer), a character cut in two at the end is left out."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            try:
                return data[:exc.start].decode("utf-8")
            except UnicodeDecodeError:
                return None
        return None


def _cut_fields(out: dict[str, Any], data: bytes, size: int, content_type: str, name: str) -> None:
    """The first bytes of a payload or output: ``name_text`` when JSON or text
    and UTF-8, else ``name_b64``; with ``name_size`` and ``name_truncated``."""
    text = utf8_text(data, len(data) < size) if is_text(content_type) else None
    if text is not None:
        out[name + "_text"] = text
    else:
        out[name + "_b64"] = base64.b64encode(data).decode("ascii")
    out[name + "_size"] = size
    out[name + "_truncated"] = len(data) < size


def _optional_ns(message: Any, field: str, out: dict[str, Any]) -> None:
    if message.HasField(field):
        out[field] = str(getattr(message, field))


def result_json(result: pb.TaskResult, max_bytes: int | None = None) -> dict[str, Any]:
    """The result's document; with ``max_bytes``, its output's first
    ``max_bytes`` only (as text when JSON or text, else base64), with
    ``output_size`` and ``output_truncated``."""
    out: dict[str, Any] = {"id": str(result.id), "status": STATUS_NAMES[result.status],
                           "output_available": result.output_available}
    if result.output_available:
        content_type = result.content_type or "application/octet-stream"
        out["content_type"] = content_type
        if max_bytes is None:
            _bytes_fields(out, result.output, content_type, "output")
        elif len(result.output) <= max_bytes:
            _bytes_fields(out, result.output, content_type, "output")
            out["output_size"] = len(result.output)
            out["output_truncated"] = False
        else:
            _cut_fields(out, result.output[:max_bytes], len(result.output), content_type, "output")
    if result.message:
        out["message"] = result.message
    return out


def checkpoint_json(checkpoint: pb.StageCheckpoint) -> dict[str, Any]:
    content_type = checkpoint.content_type or "application/octet-stream"
    out: dict[str, Any] = {"stage": checkpoint.stage, "content_type": content_type}
    _bytes_fields(out, checkpoint.data, content_type, "data")
    out["attempt"] = checkpoint.attempt
    out["saved_unix_ns"] = str(checkpoint.saved_unix_ns)
    return out


def _attempt_json(attempt: pb.Attempt) -> dict[str, Any]:
    out: dict[str, Any] = {"attempt": attempt.attempt}
    if attempt.status:
        out["status"] = STATUS_NAMES[attempt.status]
    if attempt.message:
        out["message"] = attempt.message
    out["started_unix_ns"] = str(attempt.started_unix_ns)
    _optional_ns(attempt, "ended_unix_ns", out)
    if attempt.traceback:
        out["traceback"] = attempt.traceback
    if attempt.worker_id:
        out["worker_id"] = str(attempt.worker_id)
        out["worker_name"] = attempt.worker_name
    return out


def info_json(info: pb.TaskInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(info.id), "status": STATUS_NAMES[info.status], "pool": info.pool}
    if info.key:
        out["key"] = info.key
    if info.kind:
        out["kind"] = info.kind
    out["attempt"] = info.attempt
    if info.max_attempts:
        out["max_attempts"] = info.max_attempts
    if info.priority:
        out["priority"] = PRIORITY_NAMES.get(info.priority, "normal")
    if info.tenant:
        out["tenant"] = info.tenant
    if info.tags:
        out["tags"] = dict(info.tags)
    if info.labels:
        out["labels"] = dict(sorted(info.labels.items()))
    out["output_available"] = info.output_available
    if info.message:
        out["message"] = info.message
    for field in ("created_unix_ns", "started_unix_ns", "finished_unix_ns"):
        _optional_ns(info, field, out)
    if info.deps:
        out["deps"] = _deps_json(info.deps)
    if info.attempts:
        out["attempts"] = [_attempt_json(a) for a in info.attempts]
    if info.stages:
        out["stages"] = list(info.stages)
    if info.checkpoints:
        out["checkpoints"] = [checkpoint_json(c) for c in info.checkpoints]
    if info.content_type:   # a payload preview (Get)
        out["payload_content_type"] = info.content_type
        _cut_fields(out, info.payload_preview, info.payload_size, info.content_type, "payload")
    return out


def _deps_json(deps: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for dep in deps:
        item: dict[str, Any] = {"id": str(dep.ref.id)} if dep.ref.WhichOneof("ref") == "id" else {"key": dep.ref.key}
        item["cond"] = CONDITION_NAMES.get(dep.cond, "on_success")
        out.append(item)
    return out


def dependents_json(response: pb.DependentsResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(response.id), "status": STATUS_NAMES[response.status]}
    if response.key:
        out["key"] = response.key
    items = []
    for d in response.dependents:
        item: dict[str, Any] = {"id": str(d.id), "status": STATUS_NAMES[d.status], "pool": d.pool, "depth": d.depth,
                                "depends_on": [str(parent) for parent in d.depends_on]}
        if d.key:
            item["key"] = d.key
        if d.deps:
            item["deps"] = _deps_json(d.deps)
        items.append(item)
    out["dependents"] = items
    out["truncated"] = response.truncated
    if response.unavailable_shards:
        out["unavailable_shards"] = list(response.unavailable_shards)
    return out


def explanation_json(explanation: pb.Explanation) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(explanation.id), "status": STATUS_NAMES[explanation.status],
                           "pool": explanation.pool}
    if explanation.priority:
        out["priority"] = PRIORITY_NAMES.get(explanation.priority, "normal")
    if explanation.key:
        out["key"] = explanation.key
    if explanation.tenant:
        out["tenant"] = explanation.tenant
    out["summary"] = explanation.summary
    out["waiting"] = bool(explanation.reasons)
    if explanation.HasField("score"):
        out["score"] = explanation.score
    if explanation.HasField("position"):
        out["position"] = explanation.position
    out["queued"] = explanation.queued
    out["reasons"] = [{"code": r.code, "message": r.message,
                       "detail": JSON_DECODER.decode(r.detail_json) if r.detail_json else {}}
                      for r in explanation.reasons]
    out["at_unix_ns"] = str(explanation.at_unix_ns)
    return out


def ordered_totals(totals: Any) -> dict[str, int]:
    """The snapshot's totals in the documented order (a map on the wire has none), others after by name."""
    known = [name for name in TOTAL_FIELDS if name in totals]
    return {name: totals[name] for name in known + sorted(set(totals) - set(known))}


_POOL_FIELDS = ("name", *(field.wire for field in POOL_FIELDS))


def _pool_json(pool: pb.PoolSnapshot) -> dict[str, Any]:
    out = {name: getattr(pool, name) for name in _POOL_FIELDS}
    # By class name, as in the Python snapshot, the client's and the MCP tools' (the wire's list is in class order).
    out["pending_by_class"] = dict(zip(CLASSES, pool.pending_by_class))
    out["groups"] = [{"labels": dict(g.labels), "capacity": g.capacity, "busy": g.busy} for g in pool.groups]
    return out


def snapshot_json(snap: pb.SnapshotResponse) -> dict[str, Any]:
    return {"pools": [_pool_json(p) for p in snap.pools], "live_tasks": snap.live_tasks, "running": snap.running,
            "pending": snap.pending, "workers_connected": snap.workers_connected,
            "totals": ordered_totals(snap.totals), "at_unix_ns": str(snap.at_unix_ns),
            "metrics_window_s": snap.metrics_window_s, "unavailable_shards": list(snap.unavailable_shards),
            "environment": snap.environment, "region": snap.region}


__all__ = ["STATUS_NAMES", "PRIORITY_NAMES", "OVERLAP_NAMES", "CONDITION_NAMES", "JSON_DECODER", "is_json", "is_text", "utf8_text",
           "result_json", "checkpoint_json", "info_json", "explanation_json", "ordered_totals", "snapshot_json"]
