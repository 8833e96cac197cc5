"""The durable log commits on the caller's turn when the loop has nothing
else to run, which only asyncio's private ready queue tells
(``durability.ready_callbacks``, the one place that reads it). If asyncio
changes that attribute, these tests fail, instead of durable submits
silently going the slower way."""

from __future__ import annotations

import asyncio
import collections

import pytest

from cronoq.runtime.durability import _idle, ready_callbacks


def test_asyncio_loops_still_show_the_callbacks_they_will_run_next():
    for make in (asyncio.new_event_loop, asyncio.SelectorEventLoop):
        loop = make()
        try:
            ready = ready_callbacks(loop)
            assert isinstance(ready, collections.deque), \
                f"{type(loop).__name__} no longer has its ready queue: see durability.ready_callbacks"
            handle = loop.call_soon(lambda: None)
            assert list(ready) == [handle]
        finally:
            loop.close()


@pytest.mark.asyncio
async def test_the_loop_counts_as_idle_only_with_nothing_else_to_run():
    loop = asyncio.get_running_loop()
    own = loop.call_soon(lambda: None)
    assert _idle(loop, own)
    other = loop.call_soon(lambda: None)
    assert not _idle(loop, own)
    other.cancel()
    assert _idle(loop, own)
    await asyncio.sleep(0)


def test_a_loop_that_does_not_say_is_never_idle():
    class Opaque(asyncio.AbstractEventLoop):
        pass

    assert ready_callbacks(Opaque()) is None
    assert not _idle(Opaque(), None)
