"""Payloads and outputs in the server: bytes with a content type.

The server's scheduler carries ``Blob`` values; ``BlobCodec`` stores them
as the content type, a newline, then the bytes (a content type holds no
control characters), so a store keeps exactly what the client sent.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Blob", "BlobCodec", "OCTETS", "JSON", "TEXT", "check_content_type"]

OCTETS = "application/octet-stream"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
CONTENT_TYPE_LIMIT = 255


class Blob:
    """Bytes and their content type."""

    __slots__ = ("data", "content_type")

    def __init__(self, data: bytes, content_type: str = OCTETS) -> None:
        self.data = data
        self.content_type = content_type

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and (self.data, self.content_type) == (other.data, other.content_type)

    def __hash__(self) -> int:
        return hash((self.data, self.content_type))

    def __repr__(self) -> str:
        return f"Blob({len(self.data)} bytes, {self.content_type!r})"


_CHECKED: dict[str, str] = {}   # content types seen valid (a few, used again and again)


def check_content_type(value: str) -> str:
    """``value`` if it is a plausible content type: printable ASCII, at most 255 bytes."""
    if value in _CHECKED:
        return value
    if len(value) > CONTENT_TYPE_LIMIT:
        raise ValueError(f"content_type is longer than {CONTENT_TYPE_LIMIT} characters")
    if not (value.isascii() and value.isprintable()):
        raise ValueError("content_type must be printable ASCII")
    if len(_CHECKED) < 256:
        _CHECKED[value] = value
    return value


class BlobCodec:
    """Stores a ``Blob`` as ``content type + b"\\n" + bytes``."""

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, Blob):
            raise TypeError(f"the server stores Blob payloads, got {type(value).__name__}")
        return value.content_type.encode("ascii") + b"\n" + value.data

    def decode(self, data: bytes) -> Blob:
        data = bytes(data)
        head, sep, body = data.partition(b"\n")
        if not sep:
            raise ValueError("a stored payload lacks its content type")
        return Blob(body, head.decode("ascii"))
