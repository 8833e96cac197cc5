"""Which process a scheduler belongs to.

After ``os.fork()`` the child holds a copy of every scheduler but none of its
threads (a ``BlockingScheduler``'s loop thread, the pools' threads, the
store's): a call into that copy would wait forever for a thread that is not
there, and a shutdown would write to the parent's store. A fork handler counts
the forks this process descends from; a scheduler remembers the count it
started with and refuses every call once it differs.
"""

from __future__ import annotations

import os
import weakref
from typing import Callable

from ..core.errors import SchedulerError

__all__ = ["forks", "forked_error", "after_fork"]

forks = 0    # forks between the interpreter's start and this process

_callbacks: list[weakref.WeakMethod[Callable[[], None]]] = []


def after_fork(method: Callable[[], None]) -> None:
    """Call the bound ``method`` in the child of every later fork, while its
    object lives (it replaces locks that a thread of the parent may have held)."""
    _callbacks[:] = [ref for ref in _callbacks if ref() is not None]
    _callbacks.append(weakref.WeakMethod(method))


def forked_error(pid: int) -> SchedulerError:
    return SchedulerError(
        f"this scheduler runs in process {pid}; process {os.getpid()} is a fork of it and has none of "
        f"its threads: create and start a scheduler in this process, after the fork")


def _after_fork_in_child() -> None:
    global forks
    forks += 1
    for ref in list(_callbacks):
        method = ref()
        if method is not None:
            method()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
