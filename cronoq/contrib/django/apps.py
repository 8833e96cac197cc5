"""The Django app configuration of ``cronoq.contrib.django``."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class CronoqConfig(AppConfig):
    name = "cronoq.contrib.django"
    label = "cronoq"
    verbose_name = "cronoq"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.signals import request_started

        from . import configured, settings_error

        config = getattr(settings, "CRONOQ", None)
        error = settings_error(config)
        if error:
            raise ImproperlyConfigured(error)
        try:
            sched = configured()
        except (ValueError, ImportError, AttributeError) as exc:
            raise ImproperlyConfigured(f"settings.CRONOQ: {exc}") from exc
        request_started.connect(_start_on_request, dispatch_uid="cronoq-start")
        if isinstance(config, dict) and config.get("START") == "ready" and not _autoreloader_parent():
            sched.ensure_started()


def _autoreloader_parent() -> bool:
    """``manage.py runserver``'s watching process (its child, RUN_MAIN=true, serves)."""
    return sys.argv[1:2] == ["runserver"] and "--noreload" not in sys.argv and os.environ.get("RUN_MAIN") != "true"


def _start_on_request(sender: Any, **kwargs: Any) -> None:
    from . import configured

    configured().ensure_started()
