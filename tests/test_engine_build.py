"""Which build of the engine runs: ``cronoq.core.COMPILED`` against the
modules actually loaded, and against the build CI means to test
(``CRONOQ_EXPECT_COMPILED``: .ci/run runs the engine's tests under the pure
tree and under the compiled build, setup.py's CRONOQ_MYPYC=1)."""

from __future__ import annotations

import inspect
import os
from importlib.machinery import ExtensionFileLoader

import pytest

import cronoq
import cronoq.core
import cronoq.core.engine
import cronoq.core.queues
import cronoq.core.types


def is_extension(module: object) -> bool:
    return isinstance(getattr(module, "__loader__", None), ExtensionFileLoader)


def test_compiled_says_whether_the_engine_is_an_extension_module():
    assert isinstance(cronoq.core.COMPILED, bool)
    assert cronoq.core.COMPILED is is_extension(cronoq.core.engine)
    # The engine's hot modules are compiled together or not at all.
    assert is_extension(cronoq.core.queues) is cronoq.core.COMPILED
    # The modules kept in Python (setup.py's PURE) stay so in either build.
    assert not is_extension(cronoq.core) and not is_extension(cronoq.core.types)


def test_the_runtimes_hot_modules_are_compiled_with_the_engine_and_the_rest_stays_python():
    import cronoq.runtime.driver
    import cronoq.runtime.handle
    import cronoq.runtime.local
    import cronoq.runtime.process
    import cronoq.runtime.scheduler

    for module in (cronoq.runtime.driver, cronoq.runtime.handle, cronoq.runtime.local):
        assert is_extension(module) is cronoq.core.COMPILED, module.__name__
    assert not is_extension(cronoq.runtime.scheduler) and not is_extension(cronoq.runtime.process)


@pytest.mark.skipif("CRONOQ_EXPECT_COMPILED" not in os.environ,
                    reason="CRONOQ_EXPECT_COMPILED (0 or 1) names the build under test (.ci/run sets it)")
def test_the_build_under_test_is_the_one_expected():
    expected = os.environ["CRONOQ_EXPECT_COMPILED"] == "1"
    assert cronoq.core.COMPILED is expected, f"cronoq.core.engine is {cronoq.core.engine.__file__}"


def test_the_task_shows_its_options_in_either_build():
    # (TaskSpec stays Python, so its signature survives the compiled build.)
    assert "deadline_in" in inspect.signature(cronoq.Task).parameters
    with pytest.raises(TypeError, match="unknown task option: deadline"):
        cronoq.Task(None, deadline=1)
