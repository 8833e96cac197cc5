"""The calls a follower sends to the leader: one versioned table
(cronoq/runtime/operations.py), used by both sides.

- every operation's arguments and answer survive the trip as JSON;
- a call without a version (a follower of an older cronoq, during a
  rolling restart) is version 1, through the store's real inbox too;
- an unknown name or version is answered with an error that names it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

import cronoq
from cronoq.core.errors import SchedulerError
from cronoq.core.explain import Explanation, Reason
from cronoq.core.snapshot import TaskInfo
from cronoq.runtime import operations as ops
from cronoq.runtime.durability import EncodedPayloads
from cronoq.store.codec import JsonCodec
from storekit import Work, eventually, pool, sqlite_backend  # noqa: F401  (sqlite_backend is a fixture)


def trip(op, args, payloads=None):
    """``args`` sent by a follower and decoded by a leader, as JSON on the way."""
    payloads = payloads or EncodedPayloads(JsonCodec())
    body, data = op.encode_args(args, payloads)
    body["v"] = op.version
    body = json.loads(json.dumps(body))
    body["member"] = "sender"
    return ops.find(op.name, body).decode_args(body, data, payloads)


def answer_trip(op, answer):
    return op.decode_answer(json.loads(json.dumps(op.encode_answer(answer))))


def test_every_operation_is_in_the_table_once_with_a_version():
    names = [name for name, _ in ops.OPERATIONS]
    assert sorted(names) == sorted({"submit", "cancel", "info", "explain", "dependents", "snapshot", "set_capacity",
                                    "set_group_capacity", "add_recurring", "remove_recurring", "checkpoint",
                                    "reservations"})
    assert all(version == 1 for _, version in ops.OPERATIONS)


def test_arguments_and_answers_survive_the_trip():
    spec = cronoq.Task({"n": 1}, key="k", priority="high", deadline_in=5)
    got = trip(ops.SUBMIT, ops.SubmitArgs([spec], True, 1_000_000_000))
    assert got.batch is True and [(s.payload, s.key, s.priority) for s in got.specs] == [({"n": 1}, "k", 1)]
    assert answer_trip(ops.SUBMIT, [(7, False), (8, True)]) == [(7, False), (8, True)]
    assert trip(ops.CANCEL, "k") == "k" and answer_trip(ops.CANCEL, True) is True
    info = TaskInfo(3, "running", "default", "k", "default", 1, None, tenant="t")
    back = answer_trip(ops.INFO, info)
    assert (back.id, back.status, back.key, back.tenant) == (3, "running", "k", "t")
    explanation = Explanation(3, "ready", "default", "high", "k", None, 1.5, "Ready.", 1000.0, 2, 4,
                              (Reason("pool_full", "No free slot.", {"capacity": 1, "busy": 1}),))
    assert trip(ops.EXPLAIN, 3) == 3 and answer_trip(ops.EXPLAIN, explanation) == explanation
    assert trip(ops.DEPENDENTS, "k") == "k"
    assert answer_trip(ops.DEPENDENTS, [(4, "success"), (5, "failure")]) == [(4, "success"), (5, "failure")]
    assert trip(ops.SET_CAPACITY, ("default", 3)) == ("default", 3)
    assert trip(ops.SET_GROUP_CAPACITY, ("default", {"gpu": "a"}, 2)) == ("default", {"gpu": "a"}, 2)
    template = cronoq.Task("p", deadline_in=2)
    recurring = trip(ops.ADD_RECURRING, ops.RecurringArgs("nightly", "0 3 * * *", template, "UTC", "skip", None,
                                                          None))
    assert (recurring.name, recurring.template.payload, recurring.template.deadline_in_ns) == \
        ("nightly", "p", 2_000_000_000)
    assert trip(ops.REMOVE_RECURRING, "nightly") == "nightly"
    checkpoint = trip(ops.CHECKPOINT, ops.CheckpointArgs(5, 3, 1, "stage", b"data", member="forged"))
    assert (checkpoint.lease, checkpoint.data, checkpoint.member) == (5, b"data", "sender")
    assert answer_trip(ops.CHECKPOINT, 12.5) == 12.5


def test_the_leader_keeps_the_payload_as_the_follower_encoded_it():
    payloads = EncodedPayloads(JsonCodec())
    spec = trip(ops.SUBMIT, ops.SubmitArgs([cronoq.Task({"b": 1, "a": 2})], False), payloads).specs[0]
    assert payloads.encode(spec) == JsonCodec().encode({"b": 1, "a": 2})


def test_a_call_without_a_version_is_version_1():
    assert ops.find("info", {"ref": 1}) is ops.INFO


def test_an_unknown_name_or_version_is_refused_by_name():
    with pytest.raises(SchedulerError, match="unknown operation 'rename'"):
        ops.find("rename", {"v": 1})
    with pytest.raises(SchedulerError, match=r"operation 'info' version 2 is unknown to this leader, which "
                                             r"serves version 1"):
        ops.find("info", {"ref": 1, "v": 2})
    with pytest.raises(SchedulerError, match="version '1'"):
        ops.find("info", {"ref": 1, "v": "1"})


@pytest.mark.asyncio
async def test_a_leader_answers_a_follower_that_sends_no_version_and_refuses_an_unknown_one(sqlite_backend):
    work = Work()
    leader = cronoq.Scheduler([pool(work, capacity=1)], store=sqlite_backend.store())
    await leader.start()
    follower = cronoq.Scheduler([pool(Work(), capacity=1)], store=sqlite_backend.store())
    await follower.start()
    try:
        assert leader.leading and not follower.leading
        handle = await leader.submit({"name": "one"}, key="one")
        assert await handle == {"done": "one"}
        cluster = follower._leadership.cluster
        # As a follower of a cronoq before versioned operations wrote it: no "v".
        answer = await cluster.request("info", {"ref": "one"})
        assert (answer["id"], answer["status"]) == (handle.id, "succeeded")
        with pytest.raises(SchedulerError, match="operation 'info' version 9 is unknown"):
            await cluster.request("info", {"ref": "one", "v": 9})
        with pytest.raises(SchedulerError, match="unknown operation 'rename'"):
            await cluster.request("rename", {"v": 1})
        # The follower's own calls go through the table.
        assert (await follower.info("one")).status == "succeeded"
    finally:
        await follower.shutdown()
        await leader.shutdown()


@pytest.mark.asyncio
async def test_a_follower_explains_a_task_through_the_leader(sqlite_backend):
    # One executor for both: the leader may give the holder's attempt to the
    # follower's member (under load it does), and either must set ``running``.
    work = Work()
    leader = cronoq.Scheduler([pool(work, capacity=1)], store=sqlite_backend.store())
    await leader.start()
    follower = cronoq.Scheduler([pool(work, capacity=1)], store=sqlite_backend.store())
    await follower.start()
    try:
        assert leader.leading and not follower.leading
        await leader.submit({"op": "block"}, key="holder")
        await asyncio.wait_for(work.running.wait(), 30)
        await follower.submit({"name": "queued"}, key="queued")
        explained = await follower.explain("queued")
        assert (explained.status, explained.position) == ("ready", 1)
        assert [r.code for r in explained.reasons] == ["pool_full"]
        direct = await leader.explain("queued")
        assert dataclasses.replace(explained, at=0, score=0) == dataclasses.replace(direct, at=0, score=0)
        with pytest.raises(cronoq.UnknownTask):
            await follower.explain("nothing-by-this-key")
    finally:
        work.release.set()
        await follower.shutdown()
        await leader.shutdown()
