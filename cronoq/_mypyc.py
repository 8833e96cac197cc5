"""``mypyc_attr``, the class decorator that tells mypyc (the optional compiled
build, setup.py) how to compile a class, without a dependency on
mypy_extensions: mypyc reads the decorator while compiling and never calls it;
in the pure build it returns the class unchanged."""

from typing import TYPE_CHECKING, Any, Callable, TypeVar

__all__ = ["mypyc_attr"]

T = TypeVar("T")

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    def mypyc_attr(*attrs: str, **settings: Any) -> Callable[[T], T]:
        return lambda cls: cls
