"""gunicorn server hooks for the schedulers of a WSGI app.

In ``gunicorn.conf.py``::

    from cronoq.contrib.gunicorn import when_ready, post_worker_init, worker_exit  # noqa: F401

- ``when_ready`` (in the master, before it forks the workers): stops the
  schedulers the master started while it imported the app (``--preload``
  with a scheduler started at import). The master serves no request; each
  worker gets a scheduler of its own.
- ``post_worker_init`` (in each worker, once the app is loaded): starts
  every ``BlockingScheduler`` of the process that is not running yet, so a
  worker executes tasks before its first request. (Without it, each starts
  on its first call.)
- ``worker_exit`` (in each worker, as it leaves: SIGTERM, ``--max-requests``,
  a reload): shuts them down, with their ``shutdown_grace``, before the
  worker exits.

With a shared store the workers form one scheduler; without one, each is a
scheduler of its own (a warning says so). Each hook calls the one of the same
name it replaces, if you pass it: ``worker_exit = chain(worker_exit, mine)``.
"""

from __future__ import annotations

from typing import Any, Callable

from ..blocking import schedulers

__all__ = ["when_ready", "post_worker_init", "worker_exit", "chain"]


def when_ready(server: Any) -> None:
    for sched in schedulers():
        if sched.running:
            sched.shutdown()


def post_worker_init(worker: Any) -> None:
    for sched in schedulers():
        if sched.state_here in ("new", "inherited"):
            sched.ensure_started()


def worker_exit(server: Any, worker: Any) -> None:
    for sched in schedulers():
        if sched.running:
            sched.shutdown()


def chain(*hooks: Callable[..., Any]) -> Callable[..., None]:
    """One hook calling ``hooks`` in order, with the same arguments."""

    def hook(*args: Any) -> None:
        for each in hooks:
            each(*args)

    return hook
