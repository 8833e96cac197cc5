"""setuptools' build backend, with mypy among the build requirements when
CRONOQ_MYPYC=1 asks for the compiled engine (setup.py), so that an isolated
build (pip's default) has mypyc. Editable installs are pure Python whatever
the variable says."""

import contextlib
import os
from collections.abc import Iterator

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook of the backend)

# The version CI type-checks with (pyproject.toml's dev extra): the one the engine is known to compile with.
MYPYC_REQUIRES = ["mypy==2.4.1"]
FLAG = "CRONOQ_MYPYC"


@contextlib.contextmanager
def _pure() -> Iterator[None]:
    # setuptools runs setup.py to list the requirements: it must not need
    # mypyc before mypyc has been installed.
    flag = os.environ.pop(FLAG, None)
    try:
        yield
    finally:
        if flag is not None:
            os.environ[FLAG] = flag


def _requires(hook, config_settings):
    compiled = os.environ.get(FLAG) == "1"
    with _pure():
        requires = hook(config_settings)
    return requires + (MYPYC_REQUIRES if compiled else [])


def get_requires_for_build_wheel(config_settings=None):
    return _requires(build_meta.get_requires_for_build_wheel, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # An editable install runs the source tree itself: always pure Python
    # (compiled modules beside the sources would shadow every later edit).
    with _pure():
        return build_meta.build_editable(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    # The metadata is the same either way; building it pure skips a mypyc pass.
    with _pure():
        return build_meta.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def get_requires_for_build_editable(config_settings=None):
    with _pure():
        return build_meta.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    with _pure():
        return build_meta.prepare_metadata_for_build_editable(metadata_directory, config_settings)
