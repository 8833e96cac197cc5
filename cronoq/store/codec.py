"""How payloads and outputs are written to a store."""

from __future__ import annotations

import json
import json.scanner
from typing import Any, Protocol

__all__ = ["Codec", "JsonCodec"]


class Codec(Protocol):
    def encode(self, value: Any) -> bytes: ...
    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """JSON, strictly: values JSON cannot hold exactly (bytes, sets, arbitrary
    objects, NaN) raise ``TypeError``/``ValueError`` at submission. Decoding
    never runs code."""

    # One encoder for all calls: json.dumps with options builds a new one each time.
    _encode = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode

    def encode(self, value: Any) -> bytes:
        try:
            return self._encode(value).encode("utf-8")
        except ValueError as exc:
            raise TypeError(f"the payload cannot be stored as JSON: {exc}") from exc
        except TypeError as exc:
            raise TypeError(f"the payload cannot be stored as JSON: {exc} "
                            f"(pass codec= to the Scheduler for other types)") from exc

    # typeshed asks for a scanner here; the C scanner reads its options off any decoder.
    _scan = json.scanner.make_scanner(json.JSONDecoder())   # type: ignore[arg-type]

    def decode(self, data: bytes) -> Any:
        # Straight to the scanner for the compact UTF-8 this codec writes
        # (recovery decodes millions); anything else, and every error, goes
        # through json.loads.
        if type(data) is bytes:
            try:
                text = data.decode("utf-8")
                value, end = self._scan(text, 0)
            except (UnicodeDecodeError, StopIteration, ValueError):
                return json.loads(data)
            if end == len(text):
                return value
        return json.loads(data)

    def __repr__(self) -> str:
        return "JsonCodec()"
