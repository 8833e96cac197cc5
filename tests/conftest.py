import pytest


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
