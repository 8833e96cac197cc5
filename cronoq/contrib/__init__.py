"""Integrations with web servers and frameworks: small, each documented in
docs/howto/threaded-apps.md.

- ``cronoq.contrib.flask``: ``Cronoq``, a Flask extension (``init_app``;
  safe under the reloader);
- ``cronoq.contrib.django``: a Django app (``INSTALLED_APPS``, the
  ``CRONOQ`` setting, ``scheduler()``);
- ``cronoq.contrib.gunicorn``: server hooks for ``gunicorn.conf.py``.

None of them imports its framework until it is used, so cronoq does not
depend on any of them. ``store_from_url`` makes a store from a URL (for
settings kept as text).
"""

from __future__ import annotations

from typing import Any

__all__ = ["store_from_url"]


def store_from_url(url: str, **options: Any) -> Any:
    """A store from a URL: ``sqlite:///relative/path.db``,
    ``sqlite:////absolute/path.db``, or ``postgresql://user:password@host/db``
    (``PostgresStore``; ``options`` go to the store)."""
    if not isinstance(url, str):
        raise ValueError(f"a store URL must be a string, got {type(url).__name__}")
    if url.startswith("sqlite:///"):
        from ..store.sqlite import SqliteStore

        return SqliteStore(url[len("sqlite:///"):], **options)
    if url.split("://", 1)[0] in ("postgres", "postgresql", "postgresql+psycopg"):
        from ..store.postgres import PostgresStore

        return PostgresStore(url, **options)
    scheme = url.split("://", 1)[0] if "://" in url else url[:20]
    raise ValueError(f"a store URL is sqlite:///path or postgresql://..., got a URL of scheme {scheme!r}")
