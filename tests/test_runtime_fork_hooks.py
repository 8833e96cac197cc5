"""Fork hooks (cronoq.runtime.process.after_fork): in the child of a fork,
the engine driver gets a new lock, even when a thread of the parent held the
old one at the fork; a hook goes with the object that keeps it. The driver
may be compiled (setup.py), so the hooks hold no weak reference to it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import pytest

import cronoq
from cronoq.runtime import process

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")

# The cronoq under test (the source tree or a compiled build), for the child interpreter.
CRONOQ_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cronoq.__file__)))

FORK_WITH_THE_LOCK_HELD = r"""
import asyncio, os, threading
import cronoq

async def double(ctx, x):
    return x * 2

async def main():
    async with cronoq.Scheduler([cronoq.Pool("p", double, min=1, max=2, autoscale=False)]) as sched:
        assert await (await sched.submit(1)) == 2
        driver = sched._driver
        held, release = threading.Event(), threading.Event()

        def hold():
            with driver.lock:
                held.set()
                release.wait()

        thread = threading.Thread(target=hold)
        thread.start()
        held.wait()
        old = driver.lock
        pid = os.fork()
        if pid == 0:
            # The holding thread is not in the child: without the hook this would wait forever.
            fresh = driver.lock is not old and driver.lock.acquire(timeout=10)
            os._exit(0 if fresh else 1)
        release.set()
        thread.join()
        _, status = os.waitpid(pid, 0)
        print("child:", os.waitstatus_to_exitcode(status))
        print("parent:", driver.lock is old, await (await sched.submit(2)))

asyncio.run(main())
"""


def test_in_a_fork_child_the_driver_has_a_new_lock_even_if_a_parent_thread_held_the_old():
    env = dict(os.environ, PYTHONPATH=CRONOQ_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-P", "-c", FORK_WITH_THE_LOCK_HELD], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child: 0", "parent: True 4"], proc.stderr


class Owner:
    def __init__(self, calls: list[str], name: str) -> None:
        self.name = name
        self.calls = calls
        self.hook = process.after_fork(self.forked)

    def forked(self) -> None:
        self.calls.append(self.name)


def test_a_hook_runs_in_the_child_while_its_owner_keeps_it_and_goes_with_the_owner(monkeypatch):
    # Hooks of this test only: the child handler below must not replace other schedulers' locks.
    monkeypatch.setattr(process, "_hooks", weakref.WeakSet())
    monkeypatch.setattr(process, "forks", process.forks)   # the handler counts a fork: undone after
    calls: list[str] = []
    kept = Owner(calls, "kept")
    dropped = Owner(calls, "dropped")
    del dropped
    gc.collect()   # (an owner and its hook hold each other)
    assert list(process._hooks) == [kept.hook]
    before = process.forks
    process._after_fork_in_child()   # what os.register_at_fork runs in a child
    assert calls == ["kept"]
    assert process.forks == before + 1
