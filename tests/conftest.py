import os
import signal
from pathlib import Path

import freezegun
import pytest

# freeze_time reads every attribute of every loaded module; kubernetes.client loads its
# models lazily on that read, and their pydantic schemas fail on freezegun's datetime. The
# operator's tests load it: freezegun must leave it (and kopf) alone in the same process.
freezegun.configure(extend_ignore_list=["kubernetes", "kopf"])


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run tests marked slow (e.g. the long simulation sweep)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL server for this test session (see tests/pgserver.py):
    initdb + pg_ctl on a temporary directory and a free port, stopped at the end.
    Without the server binaries the tests skip, or fail under CRONOQ_REQUIRE_POSTGRES=1."""
    from pgserver import start_or_skip

    server = start_or_skip()
    try:
        yield server
    finally:
        server.stop()


def _server_starter(directory):
    from serverkit import ServerProcess

    started: list = []

    def start(config, *, wait_for="serving as the leader", env=None, args=(), name=None, timeout=30.0,
              max_files=None):
        server = ServerProcess(config, directory, env=env, args=args, name=name or f"server{len(started)}",
                               max_files=max_files)
        started.append(server)
        return server.start(wait_for=wait_for, timeout=timeout)

    def stop_all():
        for server in started:
            if server.process is not None and server.process.poll() is None:
                server.signal(signal.SIGCONT)   # a test may have paused it
                server.stop(timeout=15)

    return start, stop_all


@pytest.fixture
def servers(tmp_path):
    """Starts cronoq-server processes (tests/serverkit.py) and stops each, by pid, at the end."""
    start, stop_all = _server_starter(tmp_path)
    yield start
    stop_all()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory):
    """``servers`` for a module's shared server processes."""
    start, stop_all = _server_starter(tmp_path_factory.mktemp("servers"))
    yield start
    stop_all()


# ---------------------------------------------------------------- the dashboard's browser (tests/dashkit.py)

@pytest.fixture(scope="module")
def browser():
    from dashkit import REQUIRE_VARIABLE, find_browser, launch, required

    executable, reason = find_browser()
    if executable is None:
        if required():
            pytest.fail(f"{REQUIRE_VARIABLE} is set but the browser tests cannot run: {reason}")
        pytest.skip(f"browser tests skipped: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch(playwright, executable)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def shots(tmp_path):
    """save(page, name): a PNG of the page, in CRONOQ_DASHBOARD_SHOTS when set."""
    directory = Path(os.environ.get("CRONOQ_DASHBOARD_SHOTS") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)

    def save(page, name: str) -> Path:
        path = directory / f"dashboard-{name}.png"
        page.screenshot(path=str(path))
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return path

    return save


@pytest.fixture
def workers():
    from dashkit import DashWorker

    started: list[DashWorker] = []

    def start(target: str, pool: str = "default", slots: int = 1) -> DashWorker:
        worker = DashWorker(target, pool, slots)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
