"""A fake remote runner: what the Runner seam looks like from another process.

``FakeRemoteRunner`` keeps nothing of the scheduler but the ``RunnerLink``:
attempts go onto a queue as plain values (a "lease message"), a "worker"
thread takes them, runs the function and sends its outcome back to the loop
with ``call_soon_threadsafe``, as a network connection would. Its capacity is
its slots, announced through ``link.set_capacity`` when it connects; a
report for a lease the scheduler aborted is dropped, as a server drops
reports for leases the worker no longer holds.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import cronoq
from cronoq.runtime.runner import Attempt, RunnerLink, outcome_of

_STOP = object()


class Lease:
    """What travels to the worker: values only, no scheduler objects."""

    __slots__ = ("lease", "task_id", "attempt", "payload", "key", "tags")

    def __init__(self, attempt: Attempt) -> None:
        self.lease = attempt.lease
        self.task_id = attempt.id
        self.attempt = attempt.attempt
        self.payload = attempt.payload
        self.key = attempt.key
        self.tags = attempt.tags


class FakeRemoteRunner:
    def __init__(self, link: RunnerLink, fn: Callable[[Lease, Callable[[], bool]], Any], slots: int,
                 heartbeat_every: float | None) -> None:
        self.link = link
        self.fn = fn
        self.slots = slots
        self.heartbeat_every = heartbeat_every
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.held: dict[int, Attempt] = {}       # lease -> attempt (the server's view)
        self.taken: set[int] = set()             # leases a worker picked up
        self.lock = threading.Lock()
        self.started = 0
        self.workers = [threading.Thread(target=self._worker, daemon=True, name=f"fake-remote-{i}")
                        for i in range(slots)]
        for worker in self.workers:
            worker.start()
        link.set_capacity({}, slots)             # "connected": the pool's capacity is our slots

    # -- the Runner protocol (on the loop)

    def start(self, attempt: Attempt) -> None:
        self.held[attempt.lease] = attempt
        self.started += 1
        self.outbox.put(Lease(attempt))

    def abort(self, lease: int) -> bool:
        attempt = self.held.pop(lease, None)
        if attempt is None:
            return False
        attempt.cancelled = True
        return True

    def close(self) -> None:
        pass

    def cancel_all(self) -> list[int]:
        with self.lock:
            unstarted = [lease for lease in self.held if lease not in self.taken]
        for lease in list(self.held):
            self.abort(lease)
        for _ in self.workers:
            self.outbox.put(_STOP)
        return unstarted

    @property
    def stray_threads(self) -> int:
        return 0

    # -- the "remote" side (worker threads)

    def _worker(self) -> None:
        loop = self.link.loop
        while True:
            lease = self.outbox.get()
            if lease is _STOP:
                return
            with self.lock:
                self.taken.add(lease.lease)
            beat = self._start_heartbeats(lease.lease)
            try:
                output = self.fn(lease, lambda: not self._aborted(lease.lease))
                result: tuple = ("success", output, None, None)
            except BaseException as exc:  # noqa: B036 - reported, as a worker would
                outcome, message, retry_after = outcome_of(exc)
                result = (outcome, None, message, retry_after)
            finally:
                if beat is not None:
                    beat.set()
            try:
                loop.call_soon_threadsafe(self._reported, lease.lease, result)
            except RuntimeError:   # the loop is closed
                return

    def _aborted(self, lease: int) -> bool:
        attempt = self.held.get(lease)
        return attempt is None or attempt.cancelled

    def _start_heartbeats(self, lease: int) -> threading.Event | None:
        if self.heartbeat_every is None:
            return None
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_every):
                try:
                    self.link.loop.call_soon_threadsafe(self.link.heartbeat, lease)
                except RuntimeError:
                    return

        threading.Thread(target=beat, daemon=True).start()
        return stop

    def _reported(self, lease: int, result: tuple) -> None:
        attempt = self.held.pop(lease, None)
        if attempt is None:
            return   # aborted meanwhile: the report is for a lease no longer held
        outcome, output, message, retry_after = result
        self.link.report(attempt, outcome, output, message, retry_after)


def remote_pool(name: str, fn: Callable[..., Any], *, slots: int = 2, heartbeat_every: float | None = None,
                **options: Any) -> tuple[cronoq.Pool, list[FakeRemoteRunner]]:
    """A pool served by a FakeRemoteRunner. ``fn(lease, still_held)`` runs on
    a worker thread. Returns the pool and a list that receives the runner."""
    made: list[FakeRemoteRunner] = []

    def factory(link: RunnerLink) -> FakeRemoteRunner:
        runner = FakeRemoteRunner(link, fn, slots, heartbeat_every)
        made.append(runner)
        return runner

    options.setdefault("min", 0)
    options.setdefault("max", 64)
    options.setdefault("initial", 0)
    options.setdefault("autoscale", False)
    return cronoq.Pool(name, runner=factory, **options), made
