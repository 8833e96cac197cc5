"""A task's encoded payload is kept beside the task (``EncodedPayloads``,
its spec a weak key), never on the user's ``cronoq.Task`` object."""

from __future__ import annotations

import gc
import weakref

import pytest

import cronoq
from cronoq.core.errors import InvalidTask
from cronoq.runtime.durability import EncodedPayloads
from cronoq.store.codec import JsonCodec
from storekit import Work, pool, sqlite_backend  # noqa: F401  (sqlite_backend is a fixture)


class CountingCodec(JsonCodec):
    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, value):
        self.encoded += 1
        return super().encode(value)


@pytest.mark.asyncio
async def test_a_durable_submit_leaves_the_task_object_as_it_was(sqlite_backend):
    sched = cronoq.Scheduler([pool(Work(), capacity=1)], store=sqlite_backend.store(cluster=False))
    await sched.start()
    try:
        task = cronoq.Task({"name": "kept"}, key="kept")
        before = dict(vars(task))
        (handle,) = await sched.submit_batch([task])
        assert await handle == {"done": "kept"}
        assert vars(task) == before
    finally:
        await sched.shutdown()


def test_a_payload_is_encoded_once_and_forgotten_with_its_task():
    codec = CountingCodec()
    payloads = EncodedPayloads(codec)
    task = cronoq.Task({"n": 1})
    assert payloads.encode(task) == payloads.encode(task) == b'{"n":1}'
    assert codec.encoded == 1
    gone = weakref.ref(task)
    del task
    gc.collect()
    assert gone() is None and len(payloads._by_spec) == 0


def test_a_payload_too_deep_for_the_codec_is_an_invalid_task():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidTask, match="nested too deeply"):
        EncodedPayloads(JsonCodec()).encode(cronoq.Task(deep))
