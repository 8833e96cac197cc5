"""A Django app: one ``BlockingScheduler`` for the project, configured in
settings and started in the processes that serve requests.

``settings.py``::

    INSTALLED_APPS = [..., "cronoq.contrib.django"]
    CRONOQ = {
        "POOLS": "myproject.tasks.pools",       # a list of cronoq.Pool, or a function returning one
        "STORE": "sqlite:////var/lib/myproject/cronoq.db",   # or postgresql://..., or a dotted path
        "OPTIONS": {"shutdown_grace": 10.0},     # BlockingScheduler options (optional)
    }

In a view: ``from cronoq.contrib.django import scheduler`` then
``scheduler().enqueue(...)``. ``AppConfig.ready()`` builds the scheduler
(checking the settings) but does not start it: ``manage.py migrate`` or
``shell`` run no tasks, and neither does ``runserver``'s autoreloader parent.
It starts with the first request (the ``request_started`` signal), the
first ``scheduler()`` call, or a server hook
(``cronoq.contrib.gunicorn.post_worker_init``); set ``"START": "ready"`` to
start it in ``ready()`` instead (never in the autoreloader's parent).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from ...blocking import BlockingScheduler

__all__ = ["scheduler", "build", "settings_error"]

_lock = threading.Lock()
_sched: BlockingScheduler | None = None


def _load(path: str, what: str) -> Any:
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"CRONOQ[{what!r}] must be a dotted path (module.name), got {path!r}")
    return getattr(importlib.import_module(module), name)


def settings_error(config: Any) -> str | None:
    """What is wrong with a ``CRONOQ`` setting (None if nothing)."""
    if not isinstance(config, dict):
        return f"settings.CRONOQ must be a dict, got {type(config).__name__}"
    unknown = set(config) - {"POOLS", "STORE", "OPTIONS", "START"}
    if unknown:
        return f"settings.CRONOQ has unknown keys {sorted(unknown)} (POOLS, STORE, OPTIONS, START)"
    if "POOLS" not in config:
        return "settings.CRONOQ needs POOLS: a dotted path to a list of cronoq.Pool (or a function returning one)"
    if config.get("START", "first_use") not in ("first_use", "ready"):
        return f"settings.CRONOQ['START'] is 'first_use' or 'ready', got {config.get('START')!r}"
    return None


def build(config: Any) -> BlockingScheduler:
    """The scheduler a ``CRONOQ`` setting describes (not started)."""
    error = settings_error(config)
    if error:
        raise ValueError(error)
    pools = config["POOLS"]
    if isinstance(pools, str):
        pools = _load(pools, "POOLS")
    if callable(pools):
        pools = pools()
    store = config.get("STORE")
    if isinstance(store, str):
        if "://" in store:
            from .. import store_from_url

            store = store_from_url(store)
        else:
            store = _load(store, "STORE")
    if callable(store):
        store = store()
    return BlockingScheduler(list(pools), store=store, **dict(config.get("OPTIONS") or {}))


def configured() -> BlockingScheduler:
    """The project's scheduler, built from ``settings.CRONOQ`` (not started)."""
    global _sched
    with _lock:
        if _sched is None:
            from django.conf import settings

            _sched = build(getattr(settings, "CRONOQ", None))
        return _sched


def scheduler() -> BlockingScheduler:
    """The project's scheduler, started in this process."""
    return configured().ensure_started()
