"""The HTTP gateway's request bodies: the cost of reading one, per task.

Two parts, each the median of ``--rounds`` rounds (with min and max), in
microseconds per task, for four bodies: a single submit and a batch of
1,000 tasks, each with bench/server.py's task (a pool and a small JSON
payload) and with a task of 14 fields (key, deadline, tags, retry,
resources, dependencies...):

- ``reading``: what the checkout's gateway does with a body, from its bytes
  to the cronoq.v1 TaskSpec messages (decoding, validation, conversion).
  Run it on two checkouts to compare them (``PYTHONPATH=<checkout>``): a
  checkout without ``cronoq/server/bodies.py`` reads as it did before
  msgspec (the json module, then schema.py's fields parse the values).
- ``--candidates``: validation alone (bytes to checked values), by schema.py
  as it was (the json module and its hand-written fields, when the checkout
  has them), by a pydantic v2 model (``model_validate_json``, strict) and
  by a msgspec struct (``Decoder.decode``), the models holding the same
  rules as far as each library states them. This is what chose msgspec.

    PYTHONPATH=. python bench/validation.py [--rounds 7] [--candidates]
"""

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIMPLE = {"pool": "sink", "payload": {"n": 1}}
RICH = {"pool": "sink", "payload": {"doc": 42, "text": "hello world"}, "kind": "summarize", "priority": "high",
        "key": "summary:42", "deadline_in_s": 30, "timeout_s": 60, "tags": {"team": "search", "env": "prod"},
        "retry": {"max_attempts": 5, "initial_backoff_s": 0.5}, "resources": {"llm": 1}, "after": ["a", 17]}


def bodies() -> dict[str, tuple[bytes, bool, int, int]]:
    """name -> (body, is a batch, tasks in it, repetitions per round)."""
    return {
        "submit, bench/server.py's task": (json.dumps(SIMPLE).encode(), False, 1, 20_000),
        "submit, 14 fields": (json.dumps(RICH).encode(), False, 1, 10_000),
        "batch of 1,000, bench/server.py's task": (
            json.dumps({"tasks": [dict(SIMPLE, payload={"n": i}) for i in range(1000)]}).encode(), True, 1000, 20),
        "batch of 1,000, 14 fields": (
            json.dumps({"tasks": [dict(RICH, key=f"k{i}") for i in range(1000)]}).encode(), True, 1000, 10),
    }


def measure(run: Callable[[bytes], Any], body: bytes, tasks: int, repeat: int, rounds: int) -> tuple[float, ...]:
    run(body)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeat):
            run(body)
        times.append((time.perf_counter() - started) / repeat / tasks * 1e6)
    return statistics.median(times), min(times), max(times)


def readers() -> tuple[str, Callable[[bytes], Any], Callable[[bytes], Any]]:
    """The checkout's reading of a submit body and of a batch body, to TaskSpec messages."""
    from cronoq._proto import cronoq_pb2 as pb
    from cronoq.server import schema
    try:
        from cronoq.server.bodies import Body, task_message
    except ImportError:   # before msgspec: the json module, then the fields' parse
        from cronoq._proto.json_view import JSON_DECODER
        from cronoq.server.gateway import task_spec

        def old_submit(body: bytes) -> Any:
            return task_spec(schema.SUBMIT.parse(JSON_DECODER.decode(body.decode("utf-8")), ""))

        def old_batch(body: bytes) -> Any:
            tasks = schema.BATCH.parse(JSON_DECODER.decode(body.decode("utf-8")), "")["tasks"]
            return pb.SubmitBatchRequest(tasks=[task_spec(task) for task in tasks])

        return "json + schema.py", old_submit, old_batch
    submit, batch = Body(schema.SUBMIT), Body(schema.BATCH)

    def _batch(reader: Any, body: bytes) -> Any:
        value, payloads = reader.decode(body)
        return pb.SubmitBatchRequest(tasks=[task_message(task, payloads) for task in value["tasks"]])

    return ("msgspec (bodies.py)", lambda body: task_message(*submit.decode(body)),
            lambda body: _batch(batch, body))


def candidates() -> dict[str, tuple[Callable[[bytes], Any], Callable[[bytes], Any]]]:
    """Validation alone: name -> (submit, batch)."""
    from typing import Annotated, Literal, Union

    import msgspec
    from msgspec import UNSET, Meta, Struct, UnsetType
    from pydantic import BaseModel, ConfigDict
    from pydantic import Field as P

    from cronoq.server import schema

    out: dict[str, tuple[Callable[[bytes], Any], Callable[[bytes], Any]]] = {}
    if hasattr(schema.SUBMIT, "parse") and not hasattr(schema, "Refused"):
        from cronoq._proto.json_view import JSON_DECODER
        out["schema.py (json module + parse)"] = (
            lambda b: schema.SUBMIT.parse(JSON_DECODER.decode(b.decode("utf-8")), ""),
            lambda b: schema.BATCH.parse(JSON_DECODER.decode(b.decode("utf-8")), ""))
    pri = Literal["critical", "high", "normal", "low"]
    big = Union[Annotated[int, Meta(ge=0)], Annotated[str, Meta(pattern="^[0-9]{1,20}$")]]
    sec = Annotated[float, Meta(ge=0)]

    class MRetry(Struct, forbid_unknown_fields=True, gc=False):
        max_attempts: Annotated[float, Meta(ge=1, le=1_000_000)] | UnsetType = UNSET
        initial_backoff_s: sec | UnsetType = UNSET
        multiplier: Annotated[float, Meta(ge=1)] | UnsetType = UNSET
        max_backoff_s: sec | UnsetType = UNSET
        jitter: bool | UnsetType = UNSET

    class MTask(Struct, forbid_unknown_fields=True, gc=False):
        payload: Any = UNSET
        payload_b64: str | UnsetType = UNSET
        payload_text: str | UnsetType = UNSET
        content_type: str | UnsetType = UNSET
        pool: str | UnsetType = UNSET
        kind: str | UnsetType = UNSET
        priority: pri | UnsetType = UNSET
        key: str | UnsetType = UNSET
        tenant: str | UnsetType = UNSET
        deadline_in_s: sec | UnsetType = UNSET
        deadline_unix_ns: big | UnsetType = UNSET
        start_in_s: sec | UnsetType = UNSET
        start_unix_ns: big | UnsetType = UNSET
        tolerance_s: sec | UnsetType = UNSET
        on_miss: Literal["run_late", "skip", "fail"] | UnsetType = UNSET
        timeout_s: sec | UnsetType = UNSET
        duration_hint_s: sec | UnsetType = UNSET
        retry: MRetry | UnsetType = UNSET
        resources: dict[str, Annotated[float, Meta(ge=0)]] | UnsetType = UNSET
        after: list[Union[Annotated[str, Meta(min_length=1)], Annotated[int, Meta(ge=1)]]] | UnsetType = UNSET
        tags: dict[str, str] | UnsetType = UNSET
        labels: dict[str, str] | UnsetType = UNSET
        stages: list[Annotated[str, Meta(min_length=1)]] | UnsetType = UNSET

    class MBatch(Struct, forbid_unknown_fields=True, gc=False):
        tasks: list[MTask]

    out["msgspec Struct (Decoder.decode)"] = (msgspec.json.Decoder(MTask).decode,
                                              msgspec.json.Decoder(MBatch).decode)
    strict = ConfigDict(extra="forbid", strict=True)
    psec = Annotated[float, P(ge=0, allow_inf_nan=False)]
    pbig = Union[Annotated[int, P(ge=0)], Annotated[str, P(pattern="^[0-9]{1,20}$")]]

    class PRetry(BaseModel):
        model_config = strict
        max_attempts: Annotated[int, P(ge=1, le=1_000_000)] | None = None
        initial_backoff_s: psec | None = None
        multiplier: Annotated[float, P(ge=1, allow_inf_nan=False)] | None = None
        max_backoff_s: psec | None = None
        jitter: bool | None = None

    class PTask(BaseModel):
        model_config = strict
        payload: Any = None
        payload_b64: str | None = None
        payload_text: str | None = None
        content_type: str | None = None
        pool: str | None = None
        kind: str | None = None
        priority: pri | None = None
        key: str | None = None
        tenant: str | None = None
        deadline_in_s: psec | None = None
        deadline_unix_ns: pbig | None = None
        start_in_s: psec | None = None
        start_unix_ns: pbig | None = None
        tolerance_s: psec | None = None
        on_miss: Literal["run_late", "skip", "fail"] | None = None
        timeout_s: psec | None = None
        duration_hint_s: psec | None = None
        retry: PRetry | None = None
        resources: dict[str, Annotated[int, P(ge=0)]] | None = None
        after: list[Union[Annotated[str, P(min_length=1)], Annotated[int, P(ge=1)]]] | None = None
        tags: dict[str, str] | None = None
        labels: dict[str, str] | None = None
        stages: list[Annotated[str, P(min_length=1)]] | None = None

    class PBatch(BaseModel):
        model_config = strict
        tasks: list[PTask]

    out["pydantic v2 (model_validate_json)"] = (PTask.model_validate_json, PBatch.model_validate_json)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--candidates", action="store_true", help="also validation alone, by each library")
    args = parser.parse_args()
    import cronoq
    print(f"cronoq at {os.path.dirname(cronoq.__file__)}; python {sys.version.split()[0]}; "
          f"load {open('/proc/loadavg').read().split()[:3]}")
    name, submit, batch = readers()
    print(f"reading, bytes to TaskSpec messages: {name} (us per task: median [min, max])")
    for label, (body, is_batch, tasks, repeat) in bodies().items():
        median, low, high = measure(batch if is_batch else submit, body, tasks, repeat, args.rounds)
        print(f"  {label:40s} {median:7.2f}  [{low:.2f}, {high:.2f}]")
    if args.candidates:
        print("validation alone (us per task: median [min, max])")
        for label, (body, is_batch, tasks, repeat) in bodies().items():
            print(f"  {label}")
            for candidate, (one, many) in candidates().items():
                median, low, high = measure(many if is_batch else one, body, tasks, repeat, args.rounds)
                print(f"    {candidate:36s} {median:7.2f}  [{low:.2f}, {high:.2f}]")


if __name__ == "__main__":
    main()
