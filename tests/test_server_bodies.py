"""The gateway's request bodies (cronoq/server/bodies.py): msgspec's fast
path and the slow path that names what is wrong must agree on every body.

The fast path decodes with msgspec and converts; anything refused on the
way takes the slow path (the json module and ``Obj.problem``). So the one
way they can disagree is a body the fast path accepts and the slow path
refuses, or accepts with other values: these tests feed both paths the
same bodies, edge values of every field of the task object included, and
require the same answer."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.server.bodies import EXACT, Body, task_message
from cronoq.server.errors import ServiceError
from cronoq.server.schema import BATCH, SUBMIT, TASK_FIELDS

SUBMIT_BODY = Body(SUBMIT)
BATCH_BODY = Body(BATCH)


def outcome(read, data: bytes):
    try:
        value, payloads = read(data)
    except ServiceError as exc:
        return "refused", exc.code, exc.message
    try:
        return "accepted", json.dumps(value, sort_keys=True, default=repr), \
            [task_message(t, payloads).SerializeToString(deterministic=True)
             for t in (value["tasks"] if "tasks" in value else [value])]
    except ServiceError as exc:
        return "refused later", exc.code, exc.message


def agree(body: Body, data: bytes) -> None:
    assert outcome(body.decode, data) == outcome(lambda d: (body.slow(d), EXACT), data), data


EDGES = [None, True, False, 0, 1, -1, 2.0, 2.5, -0.0, 1e308, 10 ** 19, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64,
         "", "a", "a\x00b", "\ud800", "é", "17", "18446744073709551616", "00", "aGVsbG8=", "aGVsbG8", "aGVs bG8=",
         [], [1], ["a"], [{"id": 1}], [{"key": "k", "id": 2}], [{}], {}, {"a": "b"}, {"a": 1}, {"a\x00": "b"},
         {"max_attempts": 2.0}, {"max_attempts": 0}, {"multiplier": 0.5}, {"jitter": 1}, {"bogus": 1},
         [{"id": "5", "cond": "on_failure"}], [{"key": "x", "cond": "never"}], "critical", "run_late", "skip"]


def test_every_task_field_with_edge_values_reads_the_same_on_both_paths():
    for name in TASK_FIELDS:
        for value in EDGES:
            agree(SUBMIT_BODY, json.dumps({name: value}).encode())
            agree(BATCH_BODY, json.dumps({"tasks": [{}, {name: value}]}).encode())


def test_bodies_that_are_not_objects_or_not_json_read_the_same_on_both_paths():
    for data in (b"", b"[]", b"3", b"{", b'{"payload": 1e999}', b'{"payload": NaN}', b'\xff', b'{"a": 1} x',
                 b'{"tasks": 1}', b"{}", b'{"payload": "\\u0000"}', b'{"pool": "a\\u0000"}', b'{"pool": "\\ud800"}',
                 b'{"tags": {"\\ud800": "x"}}', b'{"payload": 1, "payload_text": "a"}', b'{"priorty": "low"}',
                 b'{"tasks": [{"after": [{"id": 1, "key": "a"}]}]}', b'{"pool": "a", "pool": 3}'):
        agree(SUBMIT_BODY, data)
        agree(BATCH_BODY, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(TASK_FIELDS) + ["wait", "wait_timeout_s", "nope"]), json_values,
                       max_size=4))
def test_random_task_objects_read_the_same_on_both_paths(task):
    agree(SUBMIT_BODY, json.dumps(task).encode())
    agree(BATCH_BODY, json.dumps({"tasks": [task]}).encode())


def test_the_fast_path_gives_the_fields_as_given():
    body = {"pool": "p", "payload": {"n": 1}, "after": ["a", 7, {"id": "9"}], "deadline_unix_ns": "12",
            "retry": {"max_attempts": 2.0}, "resources": {"gpu": 1}, "payload_b64": None}
    del body["payload_b64"]
    read, _ = SUBMIT_BODY.decode(json.dumps(body).encode())
    assert read == {"pool": "p", "payload": {"n": 1}, "after": [("key", "a"), ("id", 7), ("id", 9)],
                    "deadline_unix_ns": 12, "retry": {"max_attempts": 2}, "resources": {"gpu": 1}}
    assert type(read["retry"]["max_attempts"]) is int


def test_payloads_reach_the_worker_as_the_json_module_writes_them():
    # msgspec writes floats' exponents otherwise (1e16, not 1e+16): a body with floats keeps the json module.
    for payload in ({"n": 1, "s": "é\n\u2028"}, {"f": 1e16, "g": 3e-05, "h": 0.1}, [2 ** 70, -0.0, 1.0e300], "x"):
        read, payloads = SUBMIT_BODY.decode(json.dumps({"payload": payload}).encode())
        assert task_message(read, payloads).payload == \
            json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
