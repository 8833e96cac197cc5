"""The calls a process that follows sends to the one that leads: one table.

Each ``Operation`` has a name, a version, and how its arguments and its
answer travel: the follower encodes the arguments (``send``), the leader
decodes them, carries the call out and encodes the answer (``serve``), and
the follower decodes that. Both sides go through this table only.

On the wire, a call is a row of the store's inbox (``cronoq.store.cluster``):
the operation's name in its ``kind`` column; its arguments as a JSON object
in ``body``, with ``"v"`` the version; payloads (bytes) beside them. A body
without ``"v"`` is version 1: what a follower of a cronoq from before
versioned operations sends, so a rolling restart mixes the two. A name or
version this leader does not know is answered with a ``SchedulerError`` that
says so.
A later version of an operation is a new entry beside the old one, which
stays while processes that send it may run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Mapping, Sequence, TypeVar

from ..core.errors import InvalidTask, SchedulerError
from ..core.explain import Explanation
from ..core.persist import spec_from_record, spec_record
from ..core.snapshot import GroupSnapshot, PoolSnapshot, Reservation, Snapshot, TaskInfo
from ..core.types import TaskSpec
from .durability import EncodedPayloads

__all__ = ["Operation", "OPERATIONS", "send", "serve", "SUBMIT", "CANCEL", "INFO", "EXPLAIN", "DEPENDENTS", "SNAPSHOT",
           "SET_CAPACITY", "SET_GROUP_CAPACITY", "ADD_RECURRING", "REMOVE_RECURRING", "CHECKPOINT",
           "RESERVATIONS", "ReservationsArgs",
           "SubmitArgs", "RecurringArgs", "CheckpointArgs", "info_from_dict", "snapshot_from_dict"]

_A = TypeVar("_A")
_R = TypeVar("_R")

# What carries a call to the leader: (name, body, payloads) -> the answer's JSON value.
Request = Callable[[str, dict[str, Any], Sequence[bytes]], Awaitable[Any]]
# How the leader carries out one operation: decoded arguments -> answer.
Handler = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Operation(Generic[_A, _R]):
    name: str
    version: int
    encode_args: Callable[[_A, EncodedPayloads], tuple[dict[str, Any], list[bytes]]]
    decode_args: Callable[[dict[str, Any], list[bytes], EncodedPayloads], _A]
    encode_answer: Callable[[_R], Any]
    decode_answer: Callable[[Any], _R]

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.version)


# ---------------------------------------------------------------- answers


def info_from_dict(data: dict[str, Any]) -> TaskInfo:
    return TaskInfo(data["id"], data["status"], data["pool"], data["key"], data["kind"], data["attempt"],
                    data["message"], tenant=data.get("tenant"), max_attempts=data.get("max_attempts"))


def snapshot_from_dict(data: dict[str, Any]) -> Snapshot:
    pools = []
    for pool in data["pools"]:
        fields = dict(pool)
        fields["groups"] = [GroupSnapshot(g["labels"], g["capacity"], g["busy"]) for g in pool["groups"]]
        pools.append(PoolSnapshot(**fields))
    # (.get: a leader of an older version sends no window; its default was 60 s)
    return Snapshot(pools, dict(data["totals"]), data["live_tasks"], data["running"], data["pending"], data["at"],
                    window=data.get("window", 60.0))


def _same(value: Any) -> Any:
    return value


def _nothing(value: Any) -> None:
    return None


def _flag(value: Any) -> bool:
    return bool(value)


def _pairs_out(results: list[tuple[int, bool]]) -> list[list[Any]]:
    return [[task_id, duplicate] for task_id, duplicate in results]


def _pairs_in(answer: Any) -> list[tuple[int, bool]]:
    return [(int(task_id), bool(duplicate)) for task_id, duplicate in answer]


def _edges_out(edges: list[tuple[int, str]]) -> list[list[Any]]:
    return [[task_id, cond] for task_id, cond in edges]


def _edges_in(answer: Any) -> list[tuple[int, str]]:
    return [(int(task_id), str(cond)) for task_id, cond in answer]


# ---------------------------------------------------------------- arguments


@dataclass(slots=True)
class SubmitArgs:
    """Tasks to admit: one (``batch`` False) or a batch, atomically.
    ``now_ns``: the sender's clock, for relative deadlines."""

    specs: list[TaskSpec]
    batch: bool
    now_ns: int = 0


def _submit_out(args: SubmitArgs, payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    data = []
    for i, spec in enumerate(args.specs):
        try:
            data.append(payloads.encode(spec))
        except InvalidTask as exc:
            raise exc.at_index(i) if args.batch else exc from None
    records = [spec_record(spec, args.now_ns) for spec in args.specs]
    return {"tasks": records, "batch": args.batch}, data


def _submit_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> SubmitArgs:
    specs = []
    for record, encoded in zip(body["tasks"], data):
        spec = spec_from_record(record, payloads.codec.decode(encoded))
        payloads.remember(spec, encoded)   # stored as the follower encoded it
        specs.append(spec)
    return SubmitArgs(specs, bool(body.get("batch")))


def _ref_out(ref: int | str, payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    return {"ref": ref}, []


def _ref_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> int | str:
    ref: int | str = body["ref"]
    return ref


def _none_out(args: None, payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    return {}, []


def _none_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> None:
    return None


def _capacity_out(args: tuple[str, int], payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    return {"pool": args[0], "capacity": args[1]}, []


def _capacity_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> tuple[str, int]:
    return body["pool"], body["capacity"]


def _group_out(args: tuple[str, dict[str, str], int], payloads: EncodedPayloads
               ) -> tuple[dict[str, Any], list[bytes]]:
    return {"pool": args[0], "labels": args[1], "capacity": args[2]}, []


def _group_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads
              ) -> tuple[str, dict[str, str], int]:
    return body["pool"], body["labels"], body["capacity"]


@dataclass(slots=True)
class RecurringArgs:
    name: str
    cron: str
    template: TaskSpec
    tz: str
    overlap: str
    tolerance: float | None
    on_miss: str | None


def _recurring_out(args: RecurringArgs, payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    template = args.template
    record = spec_record(template, 0)
    record.pop("deadline_ns", None)   # relative: sent apart
    return {"name": args.name, "cron": args.cron, "template": record, "deadline_in_ns": template.deadline_in_ns,
            "tz": args.tz, "overlap": args.overlap, "tolerance": args.tolerance, "on_miss": args.on_miss}, \
        [payloads.encode(template)]


def _recurring_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> RecurringArgs:
    template = spec_from_record(body["template"], payloads.codec.decode(data[0]))
    payloads.remember(template, data[0])
    if body.get("deadline_in_ns") is not None:
        template.deadline_in_ns = body["deadline_in_ns"]
        template.plain = False
    return RecurringArgs(body["name"], body["cron"], template, body["tz"], body["overlap"], body["tolerance"],
                         body["on_miss"])


def _name_out(name: str, payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    return {"name": name}, []


def _name_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> str:
    name: str = body["name"]
    return name


@dataclass(slots=True)
class CheckpointArgs:
    """A stage's checkpoint of an attempt another process leased to this
    member. ``member``: the sender, as the store knows it (the leader sets
    it from the inbox row, whatever the body says)."""

    lease: int
    task: int
    attempt: int
    stage: str
    data: bytes
    member: str = ""


def _checkpoint_out(args: CheckpointArgs, payloads: EncodedPayloads) -> tuple[dict[str, Any], list[bytes]]:
    return {"lease": args.lease, "task": args.task, "attempt": args.attempt, "stage": args.stage}, [args.data]


def _checkpoint_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads) -> CheckpointArgs:
    return CheckpointArgs(int(body["lease"]), body["task"], body["attempt"], body["stage"], data[0],
                          str(body["member"]))


@dataclass(frozen=True, slots=True)
class ReservationsArgs:
    """``Scheduler.reservations``: how far ahead (ns), and of which pools (None: every pool)."""

    ahead_ns: int
    pools: list[str] | None


def _reservations_args_out(args: ReservationsArgs, payloads: EncodedPayloads
                           ) -> tuple[dict[str, Any], list[bytes]]:
    return {"ahead_ns": args.ahead_ns, "pools": args.pools}, []


def _reservations_args_in(body: dict[str, Any], data: list[bytes], payloads: EncodedPayloads
                          ) -> ReservationsArgs:
    pools = body.get("pools")
    return ReservationsArgs(int(body["ahead_ns"]), None if pools is None else [str(p) for p in pools])


def _reservations_out(answer: list[Reservation]) -> list[dict[str, Any]]:
    return [r.as_dict() for r in answer]


def _reservations_in(answer: Any) -> list[Reservation]:
    return [Reservation.from_dict(item) for item in answer]


def _at_out(at: float) -> dict[str, Any]:
    return {"at": at}


def _at_in(answer: Any) -> float:
    return float(answer["at"])


# ---------------------------------------------------------------- the table


SUBMIT: Operation[SubmitArgs, list[tuple[int, bool]]] = Operation(
    "submit", 1, _submit_out, _submit_in, _pairs_out, _pairs_in)
CANCEL: Operation[int | str, bool] = Operation("cancel", 1, _ref_out, _ref_in, _same, _flag)
INFO: Operation[int | str, TaskInfo] = Operation(
    "info", 1, _ref_out, _ref_in, TaskInfo.as_dict, info_from_dict)
EXPLAIN: Operation[int | str, Explanation] = Operation(
    "explain", 1, _ref_out, _ref_in, Explanation.as_dict, Explanation.from_dict)
DEPENDENTS: Operation[int | str, list[tuple[int, str]]] = Operation(
    "dependents", 1, _ref_out, _ref_in, _edges_out, _edges_in)
SNAPSHOT: Operation[None, Snapshot] = Operation(
    "snapshot", 1, _none_out, _none_in, Snapshot.as_dict, snapshot_from_dict)
SET_CAPACITY: Operation[tuple[str, int], None] = Operation(
    "set_capacity", 1, _capacity_out, _capacity_in, _nothing, _nothing)
SET_GROUP_CAPACITY: Operation[tuple[str, dict[str, str], int], None] = Operation(
    "set_group_capacity", 1, _group_out, _group_in, _nothing, _nothing)
ADD_RECURRING: Operation[RecurringArgs, None] = Operation(
    "add_recurring", 1, _recurring_out, _recurring_in, _nothing, _nothing)
REMOVE_RECURRING: Operation[str, bool] = Operation("remove_recurring", 1, _name_out, _name_in, _same, _flag)
CHECKPOINT: Operation[CheckpointArgs, float] = Operation(
    "checkpoint", 1, _checkpoint_out, _checkpoint_in, _at_out, _at_in)
RESERVATIONS: Operation[ReservationsArgs, list[Reservation]] = Operation(
    "reservations", 1, _reservations_args_out, _reservations_args_in, _reservations_out, _reservations_in)

OPERATIONS: dict[tuple[str, int], Operation[Any, Any]] = {
    op.key: op for op in (SUBMIT, CANCEL, INFO, EXPLAIN, DEPENDENTS, SNAPSHOT, SET_CAPACITY, SET_GROUP_CAPACITY,
                          ADD_RECURRING, REMOVE_RECURRING, CHECKPOINT, RESERVATIONS)}


async def send(request: Request, op: Operation[_A, _R], args: _A, payloads: EncodedPayloads) -> _R:
    """Send ``op(args)`` through ``request`` and return its decoded answer."""
    body, data = op.encode_args(args, payloads)
    body["v"] = op.version
    return op.decode_answer(await request(op.name, body, data))


def find(name: str, body: dict[str, Any]) -> Operation[Any, Any]:
    """The operation a received call names (version 1 if the body has none)."""
    version = body.get("v", 1)
    op = OPERATIONS.get((name, version)) if type(version) is int else None
    if op is None:
        known = sorted(v for n, v in OPERATIONS if n == name)
        if not known:
            raise SchedulerError(f"unknown operation {name!r} (a process of a newer cronoq sent it?)")
        raise SchedulerError(f"operation {name!r} version {version!r} is unknown to this leader, which "
                               f"serves version{'s' if len(known) > 1 else ''} "
                               f"{', '.join(map(str, known))} (a process of a newer cronoq sent it?)")
    return op


async def serve(handlers: Mapping[tuple[str, int], Handler], name: str, body: dict[str, Any], data: list[bytes],
                payloads: EncodedPayloads) -> Any:
    """Carry out a received call with its handler; its encoded answer.
    ``body["member"]`` is the sender as the store knows it (set by the
    leader's side of the cluster, whatever the sender wrote there)."""
    op = find(name, body)
    handler = handlers.get(op.key)
    if handler is None:
        raise SchedulerError(f"operation {name!r} version {op.version} is not served here")
    return op.encode_answer(await handler(op.decode_args(body, data, payloads)))
