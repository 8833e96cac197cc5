import signal

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
