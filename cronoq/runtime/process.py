"""Which process a scheduler belongs to.

After ``os.fork()`` the child holds a copy of every scheduler but none of its
threads (a ``BlockingScheduler``'s loop thread, the pools' threads, the
store's): a call into that copy would wait forever for a thread that is not
there, and a shutdown would write to the parent's store. A fork handler counts
the forks this process descends from; a scheduler remembers the count it
started with and refuses every call once it differs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import weakref
from typing import Callable, Sequence

from ..core.errors import SchedulerError

__all__ = ["forks", "forked_error", "after_fork", "ForkHook", "note_in_memory"]

forks = 0    # forks between the interpreter's start and this process

class ForkHook:
    """A callback for the child of every fork, kept by the object it serves
    (see ``after_fork``)."""

    __slots__ = ("callback", "__weakref__")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback


# Weak: a hook runs only while its owner keeps it. (Not a WeakMethod of the
# owner's method: a class compiled with mypyc takes no weak references.)
_hooks: weakref.WeakSet[ForkHook] = weakref.WeakSet()


def after_fork(callback: Callable[[], None]) -> ForkHook:
    """Call ``callback`` in the child of every later fork, while the returned
    hook lives: its owner keeps it in an attribute, so the hook goes with it
    (it replaces locks that a thread of the parent may have held)."""
    hook = ForkHook(callback)
    _hooks.add(hook)
    return hook


def forked_error(pid: int) -> SchedulerError:
    return SchedulerError(
        f"this scheduler runs in process {pid}; process {os.getpid()} is a fork of it and has none of "
        f"its threads: create and start a scheduler in this process, after the fork")


def _after_fork_in_child() -> None:
    global forks
    forks += 1
    for hook in list(_hooks):
        hook.callback()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------- in-memory schedulers in sibling processes

_MARKER_DIR = "cronoq-{uid}"


def _marker_path(pools: Sequence[str]) -> str | None:
    """The file where the in-memory schedulers of this program's sibling
    processes (same parent, same command line and directory, same pools) note
    their pids; None where that cannot be told (no parent to share, Windows)."""
    ppid = os.getppid()
    if ppid <= 1 or not hasattr(os, "getuid") or sys.argv[:1] in (["-c"], [""], []):
        return None   # no parent to share, or "python -c" / an embedded interpreter: not a server's workers
    key = "\0".join([str(ppid), os.getcwd(), *sys.argv, "|", *sorted(pools)])
    name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), _MARKER_DIR.format(uid=os.getuid()), name + ".pids")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _update(path: str, change: Callable[[set[int]], None]) -> set[int]:
    """Apply ``change`` to the pids noted in ``path`` (locked); the live pids before it."""
    import fcntl

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        pids = {int(p) for p in data.split() if p.isdigit()}
        pids = {p for p in pids if p != os.getpid() and _alive(p)}
        before = set(pids)
        change(pids)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, " ".join(str(p) for p in sorted(pids)).encode())
        return before
    finally:
        os.close(fd)


def note_in_memory(pools: Sequence[str], log: logging.Logger) -> Callable[[], None]:
    """An in-memory scheduler starts in this process: warn (once per start) if
    a sibling process runs one too (a pre-forking server's workers), or if
    this process is a fork of one that imported cronoq. Returns what to call
    at shutdown."""
    others: set[int] = set()
    path = None
    try:
        path = _marker_path(pools)
        if path is not None:
            me = os.getpid()
            others = _update(path, lambda pids: pids.add(me))
    except (OSError, ValueError, ImportError):
        path = None   # no marker here: the warning below for forks still applies
    if others or forks:
        who = (f"and so does process {', '.join(str(p) for p in sorted(others))} (same parent, same program)"
               if others else "and it is a fork of a process that imported cronoq (a pre-forking server?)")
        log.warning(
            "process %d runs a scheduler without a store, %s: each process is a scheduler of its own, so keys, "
            "statuses, handles and capacity are per process and a retried key may run once in each. Give the "
            "processes one store (cronoq.SqliteStore on one host, cronoq.PostgresStore on several) to make "
            "them one scheduler", os.getpid(), who, extra={"action": "several_processes"})

    def forget() -> None:
        if path is not None:
            me = os.getpid()
            try:
                _update(path, lambda pids: pids.discard(me))
            except (OSError, ValueError, ImportError):
                pass

    return forget
