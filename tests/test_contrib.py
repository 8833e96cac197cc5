"""cronoq.contrib outside a server: the Django app (in a subprocess, since
Django's settings are process-wide), store_from_url, the gunicorn hooks'
chain. The servers themselves run in tests/test_wsgi_servers.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import cronoq
from cronoq.contrib import store_from_url
from cronoq.contrib.gunicorn import chain

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DJANGO_PROJECT = textwrap.dedent("""
    import sys, django
    from django.conf import settings
    settings.configure(INSTALLED_APPS=["cronoq.contrib.django"], CRONOQ=eval(sys.argv[1]))
    try:
        django.setup()
    except Exception as exc:
        print(type(exc).__name__ + ":", exc)
        raise SystemExit(0)
    from cronoq.contrib.django import configured, scheduler
    print("after ready():", configured().state_here)
    from django.core.signals import request_started
    request_started.send(sender=None)
    print("after a request:", configured().state_here)
    print("result:", scheduler().submit(21).result(timeout=30))
""")

TASKS_MODULE = textwrap.dedent("""
    import cronoq

    def double(ctx, x):
        return 2 * x

    pools = [cronoq.Pool("default", double, min=1, max=2, autoscale=False)]
""")


def run_django(tmp_path, setting: str) -> list[str]:
    (tmp_path / "tasksmod.py").write_text(TASKS_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", DJANGO_PROJECT, setting], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_django_app_builds_at_ready_and_starts_on_the_first_request(tmp_path):
    pytest.importorskip("django")
    db = tmp_path / "tasks.db"
    lines = run_django(tmp_path, repr({"POOLS": "tasksmod.pools", "STORE": f"sqlite:///{db}"}))
    assert lines == ["after ready(): new", "after a request: running", "result: 42"]
    assert db.exists()


@pytest.mark.parametrize("setting, says", [
    ("{'STORE': None}", "needs POOLS"),
    ("{'POOLS': 'tasksmod.pools', 'START': 'never'}", "'first_use' or 'ready'"),
    ("{'POOLS': 'tasksmod.pools', 'STORES': 'x'}", "unknown keys ['STORES']"),
    ("{'POOLS': 'tasksmod.nothing'}", "settings.CRONOQ"),
    ("['not', 'a', 'dict']", "must be a dict"),
])
def test_django_app_reports_a_bad_setting_as_improperly_configured(tmp_path, setting, says):
    pytest.importorskip("django")
    lines = run_django(tmp_path, setting)
    assert len(lines) == 1 and lines[0].startswith("ImproperlyConfigured:") and says in lines[0], lines


def test_store_from_url_names_what_is_wrong(tmp_path):
    store = store_from_url(f"sqlite:///{tmp_path / 'a.db'}", lease_ttl=3.0)
    assert isinstance(store, cronoq.SqliteStore) and store.lease_ttl == 3.0
    assert store.path == str(tmp_path / "a.db")
    with pytest.raises(ValueError, match="scheme 'mysql'"):
        store_from_url("mysql://host/db")
    with pytest.raises(ValueError, match="must be a string"):
        store_from_url(None)   # type: ignore[arg-type]


def test_chain_calls_every_hook_in_order():
    calls = []
    hook = chain(lambda *a: calls.append(("first", a)), lambda *a: calls.append(("second", a)))
    hook("server", "worker")
    assert calls == [("first", ("server", "worker")), ("second", ("server", "worker"))]
