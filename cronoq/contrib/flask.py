"""A Flask extension: one ``BlockingScheduler`` for the app, started in the
process that serves it.

::

    from flask import Flask
    import cronoq
    from cronoq.contrib.flask import Cronoq

    app = Flask(__name__)
    tasks = Cronoq(app, pools=[cronoq.Pool("email", send_email, max=8)],
                   store=lambda: cronoq.SqliteStore("/var/lib/app/cronoq.db"))

    @app.post("/signup")
    def signup():
        tasks.enqueue({"to": request.form["email"]}, pool="email", key=f"welcome:{request.form['email']}")
        return "", 202

It never starts at import or in ``init_app``, so the reloader's watching
parent (which imports the app but serves nothing) never leads the store or
runs tasks: the scheduler starts on the first request, on the first call
(``tasks.submit``, ``tasks.scheduler``), from a server hook
(``cronoq.contrib.gunicorn.post_worker_init``), or in the reloader's
serving child as soon as ``init_app`` runs there. ``store`` may be a store or a
function making one (made when the scheduler is, in the serving process).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from ..blocking import BlockingHandle, BlockingScheduler
from ..runtime.pool import Pool

__all__ = ["Cronoq", "current"]


class Cronoq:
    """The extension (see the module documentation). ``options`` are those of
    ``BlockingScheduler`` (resources, shutdown_grace, codec, ...)."""

    def __init__(self, app: Any = None, *, pools: Sequence[Pool], store: Any = None, **options: Any) -> None:
        self.pools = list(pools)
        if not self.pools:
            raise ValueError("pools must name at least one cronoq.Pool")
        self._store = store
        self._options = options
        self._sched: BlockingScheduler | None = None
        self._lock = threading.Lock()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Any) -> None:
        """Register with ``app``: start before its first request (and, in the
        reloader's serving child, at once)."""
        app.extensions["cronoq"] = self
        app.before_request(self._before_request)
        try:
            from werkzeug.serving import is_running_from_reloader
        except ImportError:   # pragma: no cover - Flask always brings Werkzeug
            return
        if is_running_from_reloader():
            self.start()

    def _before_request(self) -> None:
        self.start()

    def _make(self) -> BlockingScheduler:
        with self._lock:
            if self._sched is None:
                store = self._store() if callable(self._store) else self._store
                self._sched = BlockingScheduler(self.pools, store=store, **self._options)
            return self._sched

    def start(self) -> BlockingScheduler:
        """Start the scheduler in this process if it does not run here yet."""
        return self._make().ensure_started()

    @property
    def scheduler(self) -> BlockingScheduler:
        """The app's scheduler, started in this process."""
        return self.start()

    def submit(self, payload: Any = None, **options: Any) -> BlockingHandle:
        return self.scheduler.submit(payload, **options)

    def enqueue(self, payload: Any = None, **options: Any) -> int:
        return self.scheduler.enqueue(payload, **options)

    def shutdown(self, grace: float | None = None) -> None:
        """Stop it in this process (interpreter exit does it too)."""
        sched = self._sched
        if sched is not None and sched.running:
            sched.shutdown(grace)


def current() -> Cronoq:
    """The ``Cronoq`` of the current Flask app (``current_app.extensions``)."""
    from flask import current_app

    ext: Cronoq = current_app.extensions["cronoq"]
    return ext

